-- Minimal fixed window, for comparison only (scripts/bench.sh): TIME, then INCR of the current
-- window's counter and PEXPIRE on its first hit. ARGV: limit, window in ms.
local t = redis.call('TIME')
local now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
local window = tonumber(ARGV[2])
local key = KEYS[1] .. ':' .. math.floor(now_ms / window)
local n = redis.call('INCR', key)
if n == 1 then
  redis.call('PEXPIRE', key, ARGV[2])
end
if n > tonumber(ARGV[1]) then
  return 0
end
return 1
