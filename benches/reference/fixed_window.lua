-- Minimal fixed window, for comparison only (scripts/bench.sh, scripts/redis_instructions.sh):
-- TIME, then INCR of the current window's counter and PEXPIRE on its first hit. ARGV: limit,
-- window in ms. Replies as the crate's script does for one policy: {verdict (-2 admitted, else
-- the retry-after in µs), remaining, reset after in µs}.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local index = math.floor(now / 1000 / window)
local key = KEYS[1] .. ':' .. index
local n = redis.call('INCR', key)
if n == 1 then
  redis.call('PEXPIRE', key, ARGV[2])
end
local reset = (index + 1) * window * 1000 - now
if n > limit then
  return {reset, 0, reset}
end
return {-2, limit - n, reset}
