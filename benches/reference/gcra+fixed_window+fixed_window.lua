-- Minimal GCRA and two fixed windows on one request (a burst, a per-minute and a per-day
-- quota), for comparison only (scripts/redis_instructions.sh): TIME once; GET of the
-- theoretical arrival time (KEYS[1]) and of each window's counter (KEYS[2], KEYS[3], each
-- with its window's number); all decided before any is charged; SET ... PX of the new
-- arrival time and INCR (with PEXPIRE on its first hit) of each counter only when all admit.
-- ARGV: GCRA's emission interval and tolerance in µs, then each window's limit and length in
-- ms. Replies as the crate's script does for three policies: per policy, {verdict (-2
-- admitted, else the retry-after in µs), remaining, reset after in µs}.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local interval, tolerance = tonumber(ARGV[1]), tonumber(ARGV[2])
-- GCRA, evaluated.
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then
  tat = now
end
local new = tat + interval
local ok = new - now <= tolerance
local reply = {}
if ok then
  reply[1], reply[2], reply[3] = -2, math.floor((tolerance - (new - now)) / interval), new - now
else
  reply[1], reply[2], reply[3] = new - now - tolerance, math.floor((tolerance - (tat - now)) / interval), tat - now
end
-- Each window, evaluated.
local counters, counts = {}, {}
for w = 1, 2 do
  local limit, window = tonumber(ARGV[2 * w + 1]), tonumber(ARGV[2 * w + 2])
  local index = math.floor(now / 1000 / window)
  counters[w] = KEYS[w + 1] .. ':' .. index
  local n = tonumber(redis.call('GET', counters[w])) or 0
  counts[w] = n
  local reset = (index + 1) * window * 1000 - now
  if n + 1 <= limit then
    reply[3 * w + 1], reply[3 * w + 2], reply[3 * w + 3] = -2, limit - n - 1, reset
  else
    reply[3 * w + 1], reply[3 * w + 2], reply[3 * w + 3] = reset, 0, reset
    ok = false
  end
end
if not ok then
  -- Denied: nothing charged, so an admitting window has one more left than it said.
  for w = 1, 2 do
    if reply[3 * w + 1] == -2 then
      reply[3 * w + 2] = reply[3 * w + 2] + 1
    end
  end
  return reply
end
redis.call('SET', KEYS[1], string.format('%d', new), 'PX', string.format('%d', math.ceil((new - now) / 1000)))
for w = 1, 2 do
  if redis.call('INCR', counters[w]) == 1 then
    redis.call('PEXPIRE', counters[w], ARGV[2 * w + 2])
  end
end
return reply
