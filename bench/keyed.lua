-- wrk script: POST a text send with a fresh Idempotency-Key on every request (the key
-- in API_KEY), so each request is a first request of its key.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local key = os.getenv("API_KEY")
if key and key ~= "" then wrk.headers["Authorization"] = "Bearer " .. key end
wrk.body = '{"instance_id":"demo","phone":"+14155550123","message_purpose":"transactional","message":"Your code is 123456"}'
-- bench/unkeyed.lua sets KEY_HEADER to a header the gateway ignores: the same work, no key.
local header = KEY_HEADER or "Idempotency-Key"
local prefix = tostring(os.time()) .. "-" .. tostring(math.random(1000000000))
local n = 0
request = function()
  n = n + 1
  wrk.headers[header] = "bench-" .. prefix .. "-" .. n
  return wrk.format()
end
