-- Minimal GCRA and fixed window on one request, for comparison only
-- (scripts/redis_instructions.sh): TIME once; GET of the theoretical arrival time (KEYS[1]) and
-- a GET of the window's counter (KEYS[2] and the window's number); both decided before either is
-- charged; SET ... PX of the new arrival time and INCR (with PEXPIRE on its first hit) only
-- when both admit. ARGV: GCRA's emission interval and tolerance in µs, the window's limit and
-- length in ms. Replies as the crate's script does for two policies: per policy, {verdict (-2
-- admitted, else the retry-after in µs), remaining, reset after in µs}.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local interval, tolerance = tonumber(ARGV[1]), tonumber(ARGV[2])
local limit, window = tonumber(ARGV[3]), tonumber(ARGV[4])
-- GCRA, evaluated.
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then
  tat = now
end
local new = tat + interval
local g_ok = new - now <= tolerance
-- The fixed window, evaluated.
local index = math.floor(now / 1000 / window)
local counter = KEYS[2] .. ':' .. index
local n = tonumber(redis.call('GET', counter)) or 0
local reset = (index + 1) * window * 1000 - now
local w_ok = n + 1 <= limit
local reply = {}
if g_ok and w_ok then
  redis.call('SET', KEYS[1], string.format('%d', new), 'PX', string.format('%d', math.ceil((new - now) / 1000)))
  if redis.call('INCR', counter) == 1 then
    redis.call('PEXPIRE', counter, ARGV[4])
  end
  return {-2, math.floor((tolerance - (new - now)) / interval), new - now, -2, limit - n - 1, reset}
end
if g_ok then
  reply[1], reply[2], reply[3] = -2, math.floor((tolerance - (tat - now)) / interval), tat - now
else
  reply[1], reply[2], reply[3] = new - now - tolerance, math.floor((tolerance - (tat - now)) / interval), tat - now
end
if w_ok then
  reply[4], reply[5], reply[6] = -2, limit - n, reset
else
  reply[4], reply[5], reply[6] = reset, 0, reset
end
return reply
