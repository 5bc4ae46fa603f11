-- wrk script (run with -t1): POST pre-signed PBX `test` events, each once (a signature
-- is accepted once). REQUESTS names a file of "timestamp signature body" lines;
-- SECRET and INTEGRATION say where to post.
local file = os.getenv("REQUESTS")
local secret = os.getenv("SECRET")
local path = "/integrations/pbx/webhook/" .. os.getenv("INTEGRATION")
local requests, next_request = {}, 1

function init(args)
  for line in io.lines(file) do
    local ts, sig, body = line:match("^(%S+) (%S+) (.*)$")
    requests[#requests + 1] = wrk.format("POST", path, {
      ["Content-Type"] = "application/json",
      ["X-Gateway-3CX-Secret"] = secret,
      ["X-Gateway-Timestamp"] = ts,
      ["X-Gateway-Signature"] = "sha256=" .. sig,
    }, body)
  end
end

function request()
  local r = requests[next_request]
  if r == nil then
    -- Out of fresh signatures: repeat the last one (answered 401 as a replay, counted
    -- as non-2xx, so a run that is too long shows up in the output).
    return requests[#requests]
  end
  next_request = next_request + 1
  return r
end
