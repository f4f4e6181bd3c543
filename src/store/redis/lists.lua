-- A key put on a list at runtime, or taken off it (store/entries.rs): its record, the one
-- string the decision reads before any policy (`listing` in decide.lua), `<deny end> <allow
-- end>` in microseconds (0: none).
-- KEYS[1]: the record. ARGV: 'deny' or 'allow', the entry's length in microseconds (0: take
-- it off), the present in microseconds ('' for Redis TIME), milliseconds added to the
-- record's life (an injected clock's slack). The record lives until its last entry ends, and
-- goes when none is left.
local now = tonumber(ARGV[3])
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local us, slack = tonumber(ARGV[2]), tonumber(ARGV[4])
local deny, allow = string.match(redis.call('GET', KEYS[1]) or '', '^(%d+) (%d+)$')
deny, allow = tonumber(deny) or 0, tonumber(allow) or 0
local ends = 0
if us > 0 then
  ends = now + us
end
if ARGV[1] == 'deny' then
  deny = ends
else
  allow = ends
end
if deny <= now then
  deny = 0
end
if allow <= now then
  allow = 0
end
local last = math.max(deny, allow)
if last == 0 then
  redis.call('DEL', KEYS[1])
else
  local record = string.format('%.0f %.0f', deny, allow)
  redis.call('SET', KEYS[1], record, 'PX', math.ceil((last - now) / 1000) + slack)
end
return 1
