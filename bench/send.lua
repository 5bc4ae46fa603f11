-- wrk script: POST a text send (or the same body to the echo) with the key in API_KEY.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local key = os.getenv("API_KEY")
if key and key ~= "" then wrk.headers["Authorization"] = "Bearer " .. key end
wrk.body = '{"instance_id":"demo","phone":"+14155550123","message_purpose":"transactional","message":"Your code is 123456"}'
