-- A network put on a list at runtime, or taken off it (store/networks.rs), in the one string
-- every instance reads: one entry a line, `<list> <network> <end>` (the end in microseconds).
-- KEYS[1]: the string. ARGV: the entry's name (`deny 203.0.113.0/24`), its line ('' to take
-- it off), the present in microseconds, the most entries, milliseconds added to the
-- string's life (an injected clock's slack). Entries past their end are dropped
-- on the way; the string lives until its last entry ends. Returns the entries kept, or
-- nothing when they would be more than the most (and nothing changed).
local name, line, now, most = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local slack = tonumber(ARGV[5])
local kept, last = {}, now
for entry in string.gmatch(redis.call('GET', KEYS[1]) or '', '[^\n]+') do
  local listed, ends = string.match(entry, '^(.*) (%d+)$')
  ends = tonumber(ends)
  if listed and listed ~= name and ends > now then
    kept[#kept + 1] = entry
    last = math.max(last, ends)
  end
end
if line ~= '' then
  kept[#kept + 1] = line
  last = math.max(last, tonumber(string.match(line, ' (%d+)$')))
end
if #kept > most then
  return false
end
if #kept == 0 then
  redis.call('DEL', KEYS[1])
  return ''
end
local text = table.concat(kept, '\n')
redis.call('SET', KEYS[1], text, 'PX', math.ceil((last - now) / 1000) + slack)
return text
