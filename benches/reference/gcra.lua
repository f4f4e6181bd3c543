-- Minimal GCRA, for comparison only (scripts/bench.sh, scripts/redis_instructions.sh): TIME,
-- GET of the theoretical arrival time, SET ... PX of the new one. ARGV: emission interval in
-- µs, tolerance in µs. Replies as the crate's script does for one policy: {verdict (-2
-- admitted, else the retry-after in µs), remaining, reset after in µs}.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local interval, tolerance = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then
  tat = now
end
local new = tat + interval
if new - now > tolerance then
  return {new - now - tolerance, math.floor((tolerance - (tat - now)) / interval), tat - now}
end
redis.call('SET', KEYS[1], string.format('%d', new), 'PX', string.format('%d', math.ceil((new - now) / 1000)))
return {-2, math.floor((tolerance - (new - now)) / interval), new - now}
