-- wrk script (run with -t1): POST pre-signed PBX `test` events, each once (a signature
-- is accepted once). REQUESTS names a file of "timestamp signature body" lines;
-- SECRET and INTEGRATION say where to post.
local file = os.getenv("REQUESTS")
local secret = os.getenv("SECRET")
local path = "/integrations/pbx/webhook/" .. os.getenv("INTEGRATION")
local requests, next_request = {}, 1
-- DELAY_MS (optional): each connection waits as long after each answer, so that the
-- load is about a fixed rate (32 connections, 4 ms: under 8,000 a second) rather than
-- as many as the gateway answers; work per event is then compared at equal batches.
local delay_ms = tonumber(os.getenv("DELAY_MS") or "")
if delay_ms then
  function delay()
    return delay_ms
  end
end

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
