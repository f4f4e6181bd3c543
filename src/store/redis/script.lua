-- tower-ratelimit: its decision script. Generated (luagen/) from
-- src/algorithm/lua/*.lua and src/store/redis/{fused,decide}.lua, with the numbers
-- Rust gives their names: do not edit it, edit them and run
-- `UPDATE_LUA=1 cargo test --lib script`.
local ALG = {}
local DECIDES = { true, false, true, true, true, true, false, false, false, false, false, false, false, false, false }
local CHARGES = { 2, 1, 0, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0 }
local ACTS = { false, false, false, false, false, false, true, true, true, true, true, true, true, true, true }
local RELIMITS = { false, false, false, false, false, false, false, false, false, false, false, false, false, true, true }
local ARGS = { 0, 0, 0, 0, 1, 2, 0, 0, 0, 1, 1, 1, 1, 1, 0 }
local GRANTS = { false, false, false, true, true, true, false, false, false, false, false, false, false, false, false }
local WIDTH = { 3, 3, 3, 6, 6, 6, 3, 3, 3, 3, 3, 3, 3, 3, 3 }
local FUSES = { true, false, false, false, false, false, false, false, false, false, false, false, false, false, false }
-- tower-ratelimit: shared helpers. Every number is an integer below 2^53, so doubles are exact;
-- divisions that must give an integer go through fdiv/cdiv. The library functions
-- used on every decision, and `redis.call` (as `call`), are upvalues set by the first decision
-- (a Redis function's library cannot reach `string` while it loads): no global lookups per
-- call. Calls cost: a Lua call is about 500 instructions of Redis's interpreter, a table about
-- 1,100 (callgrind), so the decision path makes few of either: a function marked `--@inline`
-- is written into the fused decision in place of its calls (see `luagen/`), so it
-- returns only from a line of its own, never from inside a loop.
local format, find, sub, match, byte, call
-- How an integer is formatted: '%d' where Lua's integer format is 64 bits wide (as on every
-- 64-bit Redis), which costs a fifth of '%.0f' (glibc formats doubles slowly); '%.0f' elsewhere.
-- INT2 formats two.
local INT, INT2 = '%.0f', '%.0f %.0f'

local function bind_libraries()
  format, find, sub, match, byte = string.format, string.find, string.sub, string.match, string.byte
  call = redis.call
  if format('%d', 2 ^ 53) == '9007199254740992' then
    INT, INT2 = '%d', '%d %d'
  end
end

-- Integer division by `%`, an operator, not a call to math.floor or math.ceil: for integers
-- below 2^53, a % b is exact (a / b, correctly rounded, never reaches the next integer: that
-- would take a remainder below |a| / 2^53), and so is the division of the multiple left.
--@inline
local function fdiv(a, b)
  -- The floor of a / b.
  return (a - a % b) / b
end

--@inline
local function cdiv(a, b)
  -- The ceiling of a / b.
  return (a + (-a) % b) / b
end

--@inline
local function int(n)
  return format(INT, n)
end

-- Space-separated integers, or nil when the value is missing or not ours.
local function parse(raw, count)
  if not raw then
    return nil
  end
  local t = {}
  for word in string.gmatch(raw, '%S+') do
    local n = tonumber(word)
    if not n then
      return nil
    end
    t[#t + 1] = n
  end
  if count and #t ~= count then
    return nil
  end
  return t
end

-- Milliseconds added to every TTL; set by each decision (0 unless the time is injected).
local TTL_SLACK = 0
-- The end of the block on record for the key that `store` writes, kept in its value (set
-- around each write of a key that has one).
local KEEP_BLOCK = nil

-- The string states keep a block in the same value, after a bar: "state|end". A key that
-- was never blocked has no bar, so a decision reads its block with the GET it makes anyway.
-- `raw` (a GET's reply) split into the state part (nil when the key is missing) and the
-- block's end, if any; the parsers below try the whole value first, so a key without a block
-- is read without this.
local function split_block(raw)
  if not raw then
    return nil
  end
  local bar = find(raw, '|', 1, true)
  if not bar then
    return raw
  end
  return sub(raw, 1, bar - 1), tonumber(sub(raw, bar + 1))
end

-- A string state is written with the tag of the parameters it was written under:
-- "stateTAG", or "stateTAG|end" when blocked. The tag ("Cp1,p2,...": a capital letter for the
-- algorithm's id, A for 0, then its parameters, each in base 36 or, when shorter, in decimal
-- with its trailing zeros as an exponent, `864E8`) is sent with each policy (`p.tag`, made by
-- `Tier` in Rust). A state is digits, spaces and colons, so its tag starts at the value's
-- first letter. It is that short because the value is one allocation that grows by 16 bytes
-- past 28 characters. A decision that finds another tag (the policy was reloaded with
-- another quota, or another instance still runs the old one) converts the state to its own
-- parameters first (`adopt` in decide.lua); a state without a tag is taken as written under
-- the present parameters.
-- `raw` split into the state part, its tag (nil when none) and the block's end (nil when none).
local function split_state(raw)
  local state, ends = split_block(raw)
  if not state then
    return nil
  end
  local letter = find(state, '%a')
  if not letter then
    return state, nil, ends
  end
  return sub(state, 1, letter - 1), sub(state, letter), ends
end

-- `raw` without its tag when it ends with `tag` (no block after it: a state as it is usually
-- found, read without splitting it); nil otherwise. The tag is found by a plain search from
-- where it would start, which builds no string.
--@inline
local function untagged(raw, tag)
  if find(raw, tag, #raw - #tag + 1, true) then
    return sub(raw, 1, #raw - #tag)
  end
  return nil
end

-- A one-integer state ("tat"), as a number, the block's end, if any, and the state's tag when
-- it is not the present one (`p.tag`).
--@inline
local function read1(key, p)
  local raw = call('GET', key)
  if not raw then
    return nil
  end
  local bare = untagged(raw, p.tag)
  if bare then
    local n = tonumber(bare)
    if n then
      return n
    end
  end
  local state, tag, ends = split_state(raw)
  if tag == p.tag then
    tag = nil
  end
  return tonumber(state), ends, tag
end

-- A two-integer state ("start count", "tokens last") in the table `into` (one per policy
-- position, reused from call to call: no table built per decision), the block's end, if any,
-- and the state's tag when it is not the present one; nil for the state when the key is
-- missing.
--@inline
local function read2(key, p, _, into)
  local raw = call('GET', key)
  if not raw then
    return nil
  end
  local a, b, tag, ends
  local t = p.tag
  if find(raw, t, #raw - #t + 1, true) then
    a, b = match(raw, '^(%d+) (%d+)~')
  end
  if not a then
    local state
    state, tag, ends = split_state(raw)
    if tag == p.tag then
      tag = nil
    end
    a, b = match(state or '', '^(%d+) (%d+)$')
    if not a then
      return nil, ends, tag
    end
  end
  into[1], into[2] = tonumber(a), tonumber(b)
  return into, ends, tag
end

-- `amount`, counted in `from` per unit, counted in `to` per unit instead (twin of `rescale` in
-- Rust): whole units exactly, the part of a unit in double arithmetic (the same operations as
-- Rust's f64), rounded up; below 2^53.
local function rescale(amount, from, to)
  local most = fdiv(9007199254740992, to) - 1
  local whole = fdiv(amount, from)
  if whole >= most then
    return most * to
  end
  local part = amount - whole * from
  local r = whole * to
  if part > 0 then
    r = r + math.ceil(part / from * to)
  end
  return r
end

-- Milliseconds from `now` to `expires_at`, rounded up, plus the slack; at least 1.
--@inline
local function ttl_ms(now, expires_at)
  local ms = cdiv(expires_at - now, 1000)
  ms = ms + TTL_SLACK
  if ms < 1 then
    return 1
  end
  return ms
end

-- When a key whose state expires at `expires_at` may expire, keeping the block on record.
--@inline
local function until_block_ends(expires_at)
  if KEEP_BLOCK and KEEP_BLOCK > expires_at then
    return KEEP_BLOCK
  end
  return expires_at
end

-- The TTL of a key being blocked until `ends`: what it has left, or to the block's end.
local function ttl_to_block_end(key, now, ends)
  local ttl = ttl_ms(now, ends)
  local left = call('PTTL', key)
  if left > ttl then
    return left
  end
  return ttl
end

-- Writes a string state, tagged with the parameters `p` it was written under, with a TTL
-- (milliseconds, rounded up, at least 1) until expires_at, keeping the block on record beside
-- it.
--@inline
local function store(key, p, value, now, expires_at)
  value = value .. p.tag
  if p.limit_end and p.limit_end > expires_at then
    -- A key's own limit lives until it ends.
    expires_at = p.limit_end
  end
  if KEEP_BLOCK then
    local block_end = int(KEEP_BLOCK)
    value = value .. '|' .. block_end
    expires_at = until_block_ends(expires_at)
  end
  local ms = ttl_ms(now, expires_at)
  -- The TTL formatted here: Redis formats a number argument with '%.17g', at four times the cost.
  call('SET', key, value, 'PX', format(INT, ms))
end

-- Blocks a key with a string state until `ends`: its state stays as it is, and the key lives
-- at least until the block ends.
local function block_in_value(self, key, p, st, now, ends)
  local raw = split_block(call('GET', key)) or ''
  call('SET', key, raw .. '|' .. int(ends), 'PX', ttl_to_block_end(key, now, ends))
end

-- The token and leaky buckets keep "amount last": the time of their last update, which is
-- never moved back, and how far it is ahead of `now` when the clock went back.
--@inline
local function last_after(st, now)
  if st and st[2] > now then
    return st[2]
  end
  return now
end

--@inline
local function bucket_lag(p, st, now)
  local last = last_after(st, now)
  return last - now
end

-- The buckets' `release` (twin of their `Step::release`): gives back the latest slot only,
-- the one the bucket was last updated at.
local function bucket_release(self, key, p, st, now, slot, units)
  if st and st[2] == slot then
    self:refund(key, p, st, now, units)
  end
end


-- Tables reused from call to call (a table costs Redis about 1,100 instructions to build and
-- collect): per policy position, a table to load its state in and one for the state as strict
-- as a lease makes it (the first position's made here, the others by the first decision of
-- that many policies); the reply. A call runs alone, and Redis has read the reply before the
-- next one.
local STATES, LEASED = { {} }, { {} }
local REPLY = {}

-- Numbers read from the strings a call sends, remembered: `tonumber` reads a string with
-- strtod, about 1,800 instructions, where a table lookup costs a tenth of that. What is
-- remembered is what the policies send, a bounded set: the shapes, and each tag's parameters
-- (a tag is the algorithm and its parameters: they are sent as the tag only). Kept from call
-- to call when the decision runs as a function; a script starts afresh each call.
local SHAPES, TAGGED, TAGS = {}, {}, 0

-- The shape sent as `s`, a number; nil when it is not one.
local function read_shape(s)
  local shape = tonumber(s)
  if shape and shape >= 0 and shape < 2 * 2048 then
    SHAPES[s] = shape
  end
  return shape
end

-- The parameters a tag names (see `split_state`) in `into` (from its first place), and the
-- algorithm's letter; nil when `tag` is not one.
local function tag_params(tag, into)
  local id, rest = match(tag, '^(%u)(.*)$')
  if not id then
    return nil
  end
  if find(rest, '@', 1, true) then
    -- A key's own limit's quota follows its parameters (see `own_params`).
    rest = string.gsub(rest, '@[^;]*', '')
  end
  local k = 0
  for word in string.gmatch(rest, '[^,;]+') do
    k = k + 1
    if find(word, 'E', 1, true) then
      into[k] = tonumber(word)
    else
      into[k] = tonumber(word, 36)
    end
    if not into[k] then
      return nil
    end
  end
  return id
end

-- Keeps the parameters `p` of `tag` for the next call with it (at most 1,000 tags: then
-- forgotten all at once).
local function remember(tag, p)
  if TAGS >= 1000 then
    TAGGED, TAGS = {}, 0
  end
  TAGGED[tag] = p
  TAGS = TAGS + 1
end

-- The parameters of the policy sent with `tag`: a table { p1, p2, ..., tag = tag }, the same
-- one for every call with that tag (never written to); nil when the tag is not one.
--@inline
local function read_params(tag)
  local p = TAGGED[tag or '']
  if not p and tag then
    -- A calendar's boundaries follow its tag after ';': parameters, not part of the tag.
    local semi = find(tag, ';', 1, true)
    p = { tag = semi and sub(tag, 1, semi - 1) or tag }
    if not tag_params(tag, p) then
      p = nil
    else
      remember(tag, p)
    end
  end
  return p
end

-- The parameters of a key's own limit, from the tag its state is written under:
-- "<parameters>@<end>,<limit>,<window>,<burst>" (`RateLimitLayer::set_limit`): a table
-- { p1, p2, ..., tag = stale, limit_end = end, quota = { limit, window, burst } }, the same
-- one for every call with that tag; a calendar's boundaries are the call's (`p`'s: a key's
-- own limit keeps its policy's period). Nil when it is not one.
local function own_params(stale, p)
  local o = TAGGED[stale]
  if not o then
    local at = find(stale, '@', 1, true)
    if not at then
      return nil
    end
    o = { tag = stale }
    local numbers = {}
    if not tag_params(stale, o) or not tag_params('Q' .. sub(stale, at + 1), numbers) then
      return nil
    end
    o.limit_end, o.quota = numbers[1], { numbers[2], numbers[3], numbers[4] }
    remember(stale, o)
  end
  if o[2] == 0 and p[2] == 0 then
    o[4], o[5], o[6], o[7] = p[4], p[5], p[6], p[7]
  end
  return o
end

-- The time: the injected one (and the TTL slack) at the end of the arguments, else Redis TIME.
--@inline
local function clock(args, injected)
  if injected then
    TTL_SLACK = tonumber(args[#args])
    return tonumber(args[#args - 1])
  end
  TTL_SLACK = 0
  local t = call('TIME')
  return t[1] * 1000000 + t[2]
end

-- The clock-lag adjustment (twin of `evaluate_with_lag`), for the algorithms that keep their own
-- time (`alg.lag`, which gives `lag`): a state newer than `now` (the clock went back, or a
-- request reserved a later slot) decides as of its own time, its times moved to be from `now`,
-- and admits no cost before then. Called only for those algorithms, so the others pay nothing
-- for it.
--@inline
local function shift(lag, cost, ok, remaining, reset, retry)
  if lag > 0 then
    remaining = 0
    -- Not a fresh key before its own time, even with nothing counted there.
    reset = reset + lag
    if retry >= 0 then
      retry = retry + lag
    end
    if ok == 1 and cost > 0 then
      ok, retry = 0, lag
      if reset < lag then
        reset = lag
      end
    end
  end
  return ok, remaining, reset, retry
end
-- Fixed window: twin of fixed_window.rs. Params: limit, window; for a calendar, limit, 0, the
-- calendar's id, then the boundaries the call carries (b0 .. b3: the periods before, holding
-- and after the caller's time). State: "start count".
-- Built when a decision first uses it (`algorithm` in decide.lua).
ALG[1] = function()
  --@inline
  local load = read2

  -- The calendar period holding t, among the call's boundaries; past them, one more of the
  -- last one's length (only a clock a whole period away from the caller's gets there).
  local function period(p, t)
    if t < p[5] then
      return p[4], p[5]
    end
    if t < p[6] then
      return p[5], p[6]
    end
    if t < p[7] then
      return p[6], p[7]
    end
    return p[7], p[7] + p[7] - p[6]
  end

  -- The start and end of the window holding t (twin of `FixedWindow::bounds`).
  local function bounds(p, t)
    local w = p[2]
    if w > 0 then
      -- `fdiv`'s `%`, the multiple kept.
      local start = t - t % w
      return start, start + w
    end
    return period(p, t)
  end

  -- The running window's start, count and end; a state from a later window (a reserved
  -- slot, or the clock went back) is kept as the running one. The window holding `now` is
  -- `bounds`, written out for the usual window of the usual call.
  --@inline
  local function current(p, st, now)
    local w = p[2]
    local start, ends
    if w > 0 then
      start = now - now % w
      ends = start + w
    else
      start, ends = period(p, now)
    end
    if st and st[1] >= start then
      if st[1] > start then
        start, ends = bounds(p, st[1])
      end
      return start, st[2], ends
    end
    return start, 0, ends
  end

  -- A state from a later window (a reserved slot, or the clock went back) starts there.
  --@inline
  local function lag(p, st, now)
    if st and st[1] > now then
      return st[1] - now
    end
    return 0
  end

  --@inline
  local function evaluate(self, p, st, now, cost)
    local limit = p[1]
    local start, count, ends = current(p, st, now)
    -- As of the state's own time when it is ahead (see `lag`).
    local from = now
    if start > from then
      from = start
    end
    local left = ends - from
    local remaining = limit - count
    if remaining < 0 then
      remaining = 0
    end
    -- The reset after `count` units: none when the window is empty.
    if cost > limit then
      return 0, remaining, count == 0 and 0 or left, -1
    end
    if count + cost <= limit then
      return 1, remaining - cost, count + cost == 0 and 0 or left, -1
    end
    return 0, remaining, count == 0 and 0 or left, left
  end

  --@inline
  local function commit(self, key, p, st, now, cost)
    local start, count, ends = current(p, st, now)
    store(key, p, format(INT2, start, count + cost), now, ends)
  end

  -- The fused decisions of policies enforced (`FUSES[op]`), the usual request: the phases of
  -- `decide` for that case, in functions per algorithm. The generator (luagen/) writes them
  -- into each twin, with the twin's own `load`, `evaluate`, `commit` and `lag` written in place
  -- of their calls. A key blocked, or written under other parameters, is left to the general
  -- path: nil, having written nothing.
  
  -- One policy alone. `args` are the policy's arguments, `shape` their first.
  local function fused(key, args, shape)
    local cost, at = 1, 2
    if shape % 2048 >= 1024 then
      cost = tonumber(args[2])
      at = 3
    end
    local p
    do -- read_params
      local tag = args[at]
      local p_1 = TAGGED[tag or '']
      if not p_1 and tag then
        local semi = find(tag, ';', 1, true)
        p_1 = { tag = semi and sub(tag, 1, semi - 1) or tag }
        if not tag_params(tag, p_1) then
          p_1 = nil
        else
          remember(tag, p_1)
        end
      end
      p = p_1
    end
    if not p then
      return nil
    end
    local now
    repeat -- clock
      local injected = shape >= 2048
      if injected then
        TTL_SLACK = tonumber(args[#args])
        now = tonumber(args[#args - 1]) break
      end
      TTL_SLACK = 0
      local t = call('TIME')
      now = t[1] * 1000000 + t[2] break
    until true
    local st, ends, stale
    repeat -- read2
      local into = STATES[1]
      local raw = call('GET', key)
      if not raw then
        st, ends, stale = nil break
      end
      local a, b, tag, ends_3
      local t = p.tag
      if find(raw, t, #raw - #t + 1, true) then
        a, b = match(raw, '^(%d+) (%d+)~')
      end
      if not a then
        local state
        state, tag, ends_3 = split_state(raw)
        if tag == p.tag then
          tag = nil
        end
        a, b = match(state or '', '^(%d+) (%d+)$')
        if not a then
          st, ends, stale = nil, ends_3, tag break
        end
      end
      into[1], into[2] = tonumber(a), tonumber(b)
      st, ends, stale = into, ends_3, tag break
    until true
    if ends or stale then
      return nil
    end
    local ok, remaining, reset, retry
    repeat -- evaluate
      local limit = p[1]
      local start, count, ends
      repeat -- current
        local w = p[2]
        local start_5, ends_5
        if w > 0 then
          start_5 = now - now % w
          ends_5 = start_5 + w
        else
          start_5, ends_5 = period(p, now)
        end
        if st and st[1] >= start_5 then
          if st[1] > start_5 then
            start_5, ends_5 = bounds(p, st[1])
          end
          start, count, ends = start_5, st[2], ends_5 break
        end
        start, count, ends = start_5, 0, ends_5 break
      until true
      local from = now
      if start > from then
        from = start
      end
      local left = ends - from
      local remaining_4 = limit - count
      if remaining_4 < 0 then
        remaining_4 = 0
      end
      if cost > limit then
        ok, remaining, reset, retry = 0, remaining_4, count == 0 and 0 or left, -1 break
      end
      if count + cost <= limit then
        ok, remaining, reset, retry = 1, remaining_4 - cost, count + cost == 0 and 0 or left, -1 break
      end
      ok, remaining, reset, retry = 0, remaining_4, count == 0 and 0 or left, left break
    until true
    local behind
    repeat -- lag
      if st and st[1] > now then
        behind = st[1] - now break
      end
      behind = 0 break
    until true
    if behind > 0 then
      do -- shift
        local lag, ok_7, remaining_7, reset_7, retry_7 = behind, ok, remaining, reset, retry
        if lag > 0 then
          remaining_7 = 0
          reset_7 = reset_7 + lag
          if retry_7 >= 0 then
            retry_7 = retry_7 + lag
          end
          if ok_7 == 1 and cost > 0 then
            ok_7, retry_7 = 0, lag
            if reset_7 < lag then
              reset_7 = lag
            end
          end
        end
        ok, remaining, reset, retry = ok_7, remaining_7, reset_7, retry_7
      end
    end
    REPLY[2], REPLY[3], REPLY[3 + 1] = remaining, reset, nil
    if ok ~= 1 then
      if retry < 0 then
        REPLY[1] = -1
      else
        REPLY[1] = retry
      end
    else
      REPLY[1] = -2
      if cost > 0 then
        repeat -- commit
          local start, count, ends
          repeat -- current
            local w = p[2]
            local start_9, ends_9
            if w > 0 then
              start_9 = now - now % w
              ends_9 = start_9 + w
            else
              start_9, ends_9 = period(p, now)
            end
            if st and st[1] >= start_9 then
              if st[1] > start_9 then
                start_9, ends_9 = bounds(p, st[1])
              end
              start, count, ends = start_9, st[2], ends_9 break
            end
            start, count, ends = start_9, 0, ends_9 break
          until true
          repeat -- store
            local value, expires_at = format(INT2, start, count + cost), ends
            value = value .. p.tag
            if p.limit_end and p.limit_end > expires_at then
              expires_at = p.limit_end
            end
            if KEEP_BLOCK then
              local block_end
              do -- int
                local n = KEEP_BLOCK
                block_end = format(INT, n)
              end
              value = value .. '|' .. block_end
              repeat -- until_block_ends
                local expires_at_12 = expires_at
                if KEEP_BLOCK and KEEP_BLOCK > expires_at_12 then
                  expires_at = KEEP_BLOCK break
                end
                expires_at = expires_at_12 break
              until true
            end
            local ms
            repeat -- ttl_ms
              local ms_13
              do -- cdiv
                local a, b = expires_at - now, 1000
                ms_13 = (a + (-a) % b) / b
              end
              ms_13 = ms_13 + TTL_SLACK
              if ms_13 < 1 then
                ms = 1 break
              end
              ms = ms_13 break
            until true
            call('SET', key, value, 'PX', format(INT, ms))
          until true
        until true
        return REPLY
      end
    end
    -- Not charged: a key that lost its TTL gets one (as `apply` does).
    if call('PTTL', key) == -1 then
      local ms
      repeat -- ttl_ms
        local expires_at = now + reset
        local ms_15
        do -- cdiv
          local a, b = expires_at - now, 1000
          ms_15 = (a + (-a) % b) / b
        end
        ms_15 = ms_15 + TTL_SLACK
        if ms_15 < 1 then
          ms = 1 break
        end
        ms = ms_15 break
      until true
      call('PEXPIRE', key, ms)
    end
    return REPLY
  end
  
  -- Phase one of several policies enforced (`decide_fused` in decide.lua), for the one at
  -- position i whose reply follows REPLY[base]: its verdict, remaining and reset in the
  -- reply; returns whether it admits and the state decided on.
  local function judged(key, p, now, cost, i, base)
    local st, ends, stale
    repeat -- read2
      local into = STATES[i]
      local raw = call('GET', key)
      if not raw then
        st, ends, stale = nil break
      end
      local a, b, tag, ends_17
      local t = p.tag
      if find(raw, t, #raw - #t + 1, true) then
        a, b = match(raw, '^(%d+) (%d+)~')
      end
      if not a then
        local state
        state, tag, ends_17 = split_state(raw)
        if tag == p.tag then
          tag = nil
        end
        a, b = match(state or '', '^(%d+) (%d+)$')
        if not a then
          st, ends, stale = nil, ends_17, tag break
        end
      end
      into[1], into[2] = tonumber(a), tonumber(b)
      st, ends, stale = into, ends_17, tag break
    until true
    if ends or stale then
      return nil
    end
    local ok, remaining, reset, retry
    repeat -- evaluate
      local limit = p[1]
      local start, count, ends
      repeat -- current
        local w = p[2]
        local start_19, ends_19
        if w > 0 then
          start_19 = now - now % w
          ends_19 = start_19 + w
        else
          start_19, ends_19 = period(p, now)
        end
        if st and st[1] >= start_19 then
          if st[1] > start_19 then
            start_19, ends_19 = bounds(p, st[1])
          end
          start, count, ends = start_19, st[2], ends_19 break
        end
        start, count, ends = start_19, 0, ends_19 break
      until true
      local from = now
      if start > from then
        from = start
      end
      local left = ends - from
      local remaining_18 = limit - count
      if remaining_18 < 0 then
        remaining_18 = 0
      end
      if cost > limit then
        ok, remaining, reset, retry = 0, remaining_18, count == 0 and 0 or left, -1 break
      end
      if count + cost <= limit then
        ok, remaining, reset, retry = 1, remaining_18 - cost, count + cost == 0 and 0 or left, -1 break
      end
      ok, remaining, reset, retry = 0, remaining_18, count == 0 and 0 or left, left break
    until true
    local behind
    repeat -- lag
      if st and st[1] > now then
        behind = st[1] - now break
      end
      behind = 0 break
    until true
    if behind > 0 then
      do -- shift
        local lag, ok_21, remaining_21, reset_21, retry_21 = behind, ok, remaining, reset, retry
        if lag > 0 then
          remaining_21 = 0
          reset_21 = reset_21 + lag
          if retry_21 >= 0 then
            retry_21 = retry_21 + lag
          end
          if ok_21 == 1 and cost > 0 then
            ok_21, retry_21 = 0, lag
            if reset_21 < lag then
              reset_21 = lag
            end
          end
        end
        ok, remaining, reset, retry = ok_21, remaining_21, reset_21, retry_21
      end
    end
    REPLY[base + 2], REPLY[base + 3] = remaining, reset
    if ok == 1 then
      REPLY[base + 1] = -2
      return true, st
    end
    if retry < 0 then
      REPLY[base + 1] = -1
    else
      REPLY[base + 1] = retry
    end
    return false, st
  end
  
  return {
    fused = fused,
    judged = judged,
    block = block_in_value,
    load = load,
    bounds = bounds,
    current = current,
    lag = lag,
    evaluate = evaluate,
    -- Twin of `FixedWindow::convert`: the running window's count carried into the new window
    -- that holds the present (or the state's later window). A calendar's window ended when
    -- the present one's window holding the present starts after it.
    convert = function(self, key, q, p, st, now)
      local ended
      if q[2] > 0 then
        ended = st[1] + q[2] <= now
      else
        ended = st[1] < self.bounds(p, now)
      end
      if ended then
        return false
      end
      local at = st[1]
      if now > at then
        at = now
      end
      local start, ends = self.bounds(p, at)
      store(key, p, format(INT2, start, st[2]), now, ends)
      return true
    end,
    -- Whether a key's own limit `o` still applies under the policy's `p`: one of calendar
    -- periods ends when the policy no longer counts the same periods (twin of
    -- `FixedWindow::keeps`).
    keeps = function(o, p)
      return o[2] ~= 0 or (p[2] == 0 and o[3] == p[3])
    end,
    -- A lease ends with the window its units are counted in.
    lease_end = function(self, p, st, now, ttl)
      local start, _, ends = self.current(p, st, now)
      local from = now
      if start > from then
        from = start
      end
      local e = from + ttl
      if e > ends - 1 then
        e = ends - 1
      end
      return e
    end,
    -- Gives back to the lease's window only: once another has begun, the units went with it.
    give_back = function(self, key, p, st, now, lease_end, units)
      if self.current(p, st, now) == self.bounds(p, lease_end) then
        self:refund(key, p, st, now, units)
      end
    end,
    refund = function(self, key, p, st, now, units)
      if not st then
        return
      end
      local start, count, ends = self.current(p, st, now)
      local left = count - units
      if left < 0 then
        left = 0
      end
      store(key, p, format(INT2, start, left), now, ends)
    end,
    commit = commit,
  }
end
-- Sliding window counter: twin of sliding_window.rs. Params: limit, buckets, bucket.
-- State: the ring of N + 1 counters indexed by bucket index mod (N + 1), after the head
-- bucket's index, written sparse: "head slot:count ...", the counters that are not zero (a
-- key spends a few buckets of its ring, so a decision parses and writes a few numbers, not
-- N + 2). Read as a table { head, c0, c1, ..., cN }. The dense form of earlier versions,
-- "head c0 c1 ... cN", is still read.
-- Built when a decision first uses it (`algorithm` in decide.lua).
ALG[2] = function()
  -- The parameters of a tag found in a state written under others.
  local OLD_RING = {}

  local function sw_read(raw, slots)
    if not raw then
      return nil
    end
    if not find(raw, ':', 1, true) and find(raw, ' ', 1, true) then
      return parse(raw, slots + 1)
    end
    local head = tonumber(match(raw, '^(%d+)'))
    if not head then
      return nil
    end
    local st = { head }
    for k = 2, slots + 1 do
      st[k] = 0
    end
    for slot, count in string.gmatch(raw, ' (%d+):(%d+)') do
      slot = tonumber(slot)
      if slot >= slots then
        return nil
      end
      st[slot + 2] = tonumber(count)
    end
    return st
  end

  -- Writes the ring of `st` (its counters at st[2] .. st[slots + 1]) after `head`, sparse.
  --@inline
  local function sw_write(key, p, head, st, slots, now, expires_at)
    local bucket = '%d:' .. INT
    local parts = { format(INT, head) }
    for i = 1, slots do
      local count = st[i + 1]
      if count > 0 then
        parts[#parts + 1] = format(bucket, i - 1, count)
      end
    end
    store(key, p, table.concat(parts, ' '), now, expires_at)
  end

  --@inline
  local function sw_count(p, st, index)
    if st and index <= st[1] and index + p[2] >= st[1] then
      local wraps = fdiv(index, p[2] + 1)
      local slot = index - wraps * (p[2] + 1)
      return st[slot + 2]
    end
    return 0
  end

  --@inline
  local function sw_position(p, st, now)
    local c = fdiv(now, p[3])
    if st and st[1] > c then
      return st[1], 0
    end
    return c, now - c * p[3]
  end

  --@inline
  local function sw_estimate(p, st, c, x)
    local n, g = p[2], p[3]
    local whole = 0
    if st then
      -- The buckets c + 1 - n .. c that the ring holds (head - n .. head), walked slot by
      -- slot: one division, not one per bucket.
      local lo, hi = c + 1 - n, c
      if lo < 0 then
        lo = 0
      end
      if lo < st[1] - n then
        lo = st[1] - n
      end
      if hi > st[1] then
        hi = st[1]
      end
      local slots = n + 1
      local wraps = fdiv(lo, slots)
      local slot = lo - wraps * slots
      for _ = lo, hi do
        whole = whole + st[slot + 2]
        slot = slot + 1
        if slot == slots then
          slot = 0
        end
      end
    end
    local oldest = 0
    if c >= n then
      oldest = sw_count(p, st, c - n)
    end
    local part = cdiv(oldest * (g - x), g)
    return whole + part
  end

  local function sw_reset(p, st, c, x)
    local n, g = p[2], p[3]
    local now = c * g + x
    local from = c - n
    if from < 0 then
      from = 0
    end
    for j = c, from, -1 do
      if sw_count(p, st, j) > 0 then
        return (j + n + 1) * g - now
      end
    end
    return 0
  end

  --@inline
  local function load(key, p)
    local raw = call('GET', key)
    if not raw then
      return nil
    end
    local bare = untagged(raw, p.tag)
    if bare then
      -- Tagged with the present parameters, no block: the state is what precedes the tag.
      return sw_read(bare, p[2] + 1)
    end
    local tag, ends
    raw, tag, ends = split_state(raw)
    if tag and tag ~= p.tag then
      -- Written under other parameters: read with their ring (their number of buckets is
      -- the tag's second parameter).
      local n = tag_params(tag, OLD_RING) and OLD_RING[2]
      return n and sw_read(raw, n + 1), ends, tag
    end
    return sw_read(raw, p[2] + 1), ends
  end

  --@inline
  local function lag(p, st, now)
    if st and st[1] * p[3] > now then
      return st[1] * p[3] - now
    end
    return 0
  end

  -- A request denied now, or not charged, at bucket `c` and `x` into it: the verdict, the
  -- remaining and reset, and when not admitted, the wait until the first bucket with room.
  local function sw_denied(p, st, c, x, cost, used, remaining)
    local limit, n, g = p[1], p[2], p[3]
    local reset_now = sw_reset(p, st, c, x)
    if cost > limit then
      return 0, remaining, reset_now, -1
    end
    if used + cost <= limit then
      return 1, remaining - cost, reset_now, -1
    end
    local now_abs = c * g + x
    for k = 0, n + 1 do
      local q = c + k
      local whole = 0
      local from = q + 1 - n
      if from < 0 then
        from = 0
      end
      for i = from, q do
        if i <= c then
          whole = whole + sw_count(p, st, i)
        end
      end
      local avail = limit - (cost + whole)
      if avail >= 0 then
        local oldest = 0
        if q >= n and q - n <= c then
          oldest = sw_count(p, st, q - n)
        end
        local x0 = 0
        if k == 0 then
          x0 = x
        end
        local xmin = x0
        if oldest > 0 then
          local part = fdiv(avail * g, oldest)
          local bound = g - part
          if bound > xmin then
            xmin = bound
          end
        end
        if xmin < g then
          return 0, remaining, reset_now, q * g + xmin - now_abs
        end
      end
    end
    return redis.error_reply('sliding_window: no retry time found')
  end

  --@inline
  local function evaluate(self, p, st, now, cost)
    local limit, n, g = p[1], p[2], p[3]
    local c, x = sw_position(p, st, now)
    local used = sw_estimate(p, st, c, x)
    local remaining = limit - used
    if remaining < 0 then
      remaining = 0
    end
    if used + cost <= limit and cost > 0 then
      -- Admitted and charged: the window is empty once this bucket has left it.
      return 1, remaining - cost, (n + 1) * g - x, -1
    end
    return sw_denied(p, st, c, x, cost, used, remaining)
  end

  --@inline
  local function commit(self, key, p, st, now, cost)
    local n, g = p[2], p[3]
    local slots = n + 1
    local c = sw_position(p, st, now)
    local wraps = fdiv(c, slots)
    local slot = c - wraps * slots
    if not st then
      -- A new key: one bucket, written without building its ring.
      store(key, p, format(INT .. ' %d:' .. INT, c, slot, cost), now, (c + slots) * g)
    else
      -- The ring read for this decision, updated in place: buckets that left it emptied.
      local head = st[1]
      if c > head then
        local stale = c - head
        if stale > slots then
          stale = slots
        end
        -- Bucket c - i is at the ring's slot `slot - i`, wrapped.
        local back = slot
        for _ = 1, stale do
          st[back + 2] = 0
          back = back - 1
          if back < 0 then
            back = slots - 1
          end
        end
        head = c
      end
      st[slot + 2] = st[slot + 2] + cost
      sw_write(key, p, head, st, slots, now, (head + slots) * g)
    end
  end

  -- The fused decisions of policies enforced (`FUSES[op]`), the usual request: the phases of
  -- `decide` for that case, in functions per algorithm. The generator (luagen/) writes them
  -- into each twin, with the twin's own `load`, `evaluate`, `commit` and `lag` written in place
  -- of their calls. A key blocked, or written under other parameters, is left to the general
  -- path: nil, having written nothing.
  
  -- One policy alone. `args` are the policy's arguments, `shape` their first.
  local function fused(key, args, shape)
    local cost, at = 1, 2
    if shape % 2048 >= 1024 then
      cost = tonumber(args[2])
      at = 3
    end
    local p
    do -- read_params
      local tag = args[at]
      local p_1 = TAGGED[tag or '']
      if not p_1 and tag then
        local semi = find(tag, ';', 1, true)
        p_1 = { tag = semi and sub(tag, 1, semi - 1) or tag }
        if not tag_params(tag, p_1) then
          p_1 = nil
        else
          remember(tag, p_1)
        end
      end
      p = p_1
    end
    if not p then
      return nil
    end
    local now
    repeat -- clock
      local injected = shape >= 2048
      if injected then
        TTL_SLACK = tonumber(args[#args])
        now = tonumber(args[#args - 1]) break
      end
      TTL_SLACK = 0
      local t = call('TIME')
      now = t[1] * 1000000 + t[2] break
    until true
    local st, ends, stale
    repeat -- load
      local raw = call('GET', key)
      if not raw then
        st, ends, stale = nil break
      end
      local bare
      repeat -- untagged
        local tag = p.tag
        if find(raw, tag, #raw - #tag + 1, true) then
          bare = sub(raw, 1, #raw - #tag) break
        end
        bare = nil break
      until true
      if bare then
        st, ends, stale = sw_read(bare, p[2] + 1) break
      end
      local tag, ends_3
      raw, tag, ends_3 = split_state(raw)
      if tag and tag ~= p.tag then
        local n = tag_params(tag, OLD_RING) and OLD_RING[2]
        st, ends, stale = n and sw_read(raw, n + 1), ends_3, tag break
      end
      st, ends, stale = sw_read(raw, p[2] + 1), ends_3 break
    until true
    if ends or stale then
      return nil
    end
    local ok, remaining, reset, retry
    repeat -- evaluate
      local limit, n, g = p[1], p[2], p[3]
      local c, x
      repeat -- sw_position
        local c_6
        do -- fdiv
          local a, b = now, p[3]
          c_6 = (a - a % b) / b
        end
        if st and st[1] > c_6 then
          c, x = st[1], 0 break
        end
        c, x = c_6, now - c_6 * p[3] break
      until true
      local used
      do -- sw_estimate
        local n, g = p[2], p[3]
        local whole = 0
        if st then
          local lo, hi = c + 1 - n, c
          if lo < 0 then
            lo = 0
          end
          if lo < st[1] - n then
            lo = st[1] - n
          end
          if hi > st[1] then
            hi = st[1]
          end
          local slots = n + 1
          local wraps
          do -- fdiv
            local a, b = lo, slots
            wraps = (a - a % b) / b
          end
          local slot = lo - wraps * slots
          for _ = lo, hi do
            whole = whole + st[slot + 2]
            slot = slot + 1
            if slot == slots then
              slot = 0
            end
          end
        end
        local oldest = 0
        if c >= n then
          repeat -- sw_count
            local index = c - n
            if st and index <= st[1] and index + p[2] >= st[1] then
              local wraps
              do -- fdiv
                local a, b = index, p[2] + 1
                wraps = (a - a % b) / b
              end
              local slot = index - wraps * (p[2] + 1)
              oldest = st[slot + 2] break
            end
            oldest = 0 break
          until true
        end
        local part
        do -- cdiv
          local a, b = oldest * (g - x), g
          part = (a + (-a) % b) / b
        end
        used = whole + part
      end
      local remaining_5 = limit - used
      if remaining_5 < 0 then
        remaining_5 = 0
      end
      if used + cost <= limit and cost > 0 then
        ok, remaining, reset, retry = 1, remaining_5 - cost, (n + 1) * g - x, -1 break
      end
      ok, remaining, reset, retry = sw_denied(p, st, c, x, cost, used, remaining_5) break
    until true
    local behind
    repeat -- lag
      if st and st[1] * p[3] > now then
        behind = st[1] * p[3] - now break
      end
      behind = 0 break
    until true
    if behind > 0 then
      do -- shift
        local lag, ok_14, remaining_14, reset_14, retry_14 = behind, ok, remaining, reset, retry
        if lag > 0 then
          remaining_14 = 0
          reset_14 = reset_14 + lag
          if retry_14 >= 0 then
            retry_14 = retry_14 + lag
          end
          if ok_14 == 1 and cost > 0 then
            ok_14, retry_14 = 0, lag
            if reset_14 < lag then
              reset_14 = lag
            end
          end
        end
        ok, remaining, reset, retry = ok_14, remaining_14, reset_14, retry_14
      end
    end
    REPLY[2], REPLY[3], REPLY[3 + 1] = remaining, reset, nil
    if ok ~= 1 then
      if retry < 0 then
        REPLY[1] = -1
      else
        REPLY[1] = retry
      end
    else
      REPLY[1] = -2
      if cost > 0 then
        repeat -- commit
          local n, g = p[2], p[3]
          local slots = n + 1
          local c
          repeat -- sw_position
            local c_16
            do -- fdiv
              local a, b = now, p[3]
              c_16 = (a - a % b) / b
            end
            if st and st[1] > c_16 then
              c = st[1], 0 break
            end
            c = c_16, now - c_16 * p[3] break
          until true
          local wraps
          do -- fdiv
            local a, b = c, slots
            wraps = (a - a % b) / b
          end
          local slot = c - wraps * slots
          if not st then
            repeat -- store
              local value, expires_at = format(INT .. ' %d:' .. INT, c, slot, cost), (c + slots) * g
              value = value .. p.tag
              if p.limit_end and p.limit_end > expires_at then
                expires_at = p.limit_end
              end
              if KEEP_BLOCK then
                local block_end
                do -- int
                  local n = KEEP_BLOCK
                  block_end = format(INT, n)
                end
                value = value .. '|' .. block_end
                repeat -- until_block_ends
                  local expires_at_21 = expires_at
                  if KEEP_BLOCK and KEEP_BLOCK > expires_at_21 then
                    expires_at = KEEP_BLOCK break
                  end
                  expires_at = expires_at_21 break
                until true
              end
              local ms
              repeat -- ttl_ms
                local ms_22
                do -- cdiv
                  local a, b = expires_at - now, 1000
                  ms_22 = (a + (-a) % b) / b
                end
                ms_22 = ms_22 + TTL_SLACK
                if ms_22 < 1 then
                  ms = 1 break
                end
                ms = ms_22 break
              until true
              call('SET', key, value, 'PX', format(INT, ms))
            until true
          else
            local head = st[1]
            if c > head then
              local stale = c - head
              if stale > slots then
                stale = slots
              end
              local back = slot
              for _ = 1, stale do
                st[back + 2] = 0
                back = back - 1
                if back < 0 then
                  back = slots - 1
                end
              end
              head = c
            end
            st[slot + 2] = st[slot + 2] + cost
            repeat -- sw_write
              local expires_at = (head + slots) * g
              local bucket = '%d:' .. INT
              local parts = { format(INT, head) }
              for i = 1, slots do
                local count = st[i + 1]
                if count > 0 then
                  parts[#parts + 1] = format(bucket, i - 1, count)
                end
              end
              repeat -- store
                local value, expires_at = table.concat(parts, ' '), expires_at
                value = value .. p.tag
                if p.limit_end and p.limit_end > expires_at then
                  expires_at = p.limit_end
                end
                if KEEP_BLOCK then
                  local block_end
                  do -- int
                    local n = KEEP_BLOCK
                    block_end = format(INT, n)
                  end
                  value = value .. '|' .. block_end
                  repeat -- until_block_ends
                    local expires_at_27 = expires_at
                    if KEEP_BLOCK and KEEP_BLOCK > expires_at_27 then
                      expires_at = KEEP_BLOCK break
                    end
                    expires_at = expires_at_27 break
                  until true
                end
                local ms
                repeat -- ttl_ms
                  local ms_28
                  do -- cdiv
                    local a, b = expires_at - now, 1000
                    ms_28 = (a + (-a) % b) / b
                  end
                  ms_28 = ms_28 + TTL_SLACK
                  if ms_28 < 1 then
                    ms = 1 break
                  end
                  ms = ms_28 break
                until true
                call('SET', key, value, 'PX', format(INT, ms))
              until true
            until true
          end
        until true
        return REPLY
      end
    end
    -- Not charged: a key that lost its TTL gets one (as `apply` does).
    if call('PTTL', key) == -1 then
      local ms
      repeat -- ttl_ms
        local expires_at = now + reset
        local ms_30
        do -- cdiv
          local a, b = expires_at - now, 1000
          ms_30 = (a + (-a) % b) / b
        end
        ms_30 = ms_30 + TTL_SLACK
        if ms_30 < 1 then
          ms = 1 break
        end
        ms = ms_30 break
      until true
      call('PEXPIRE', key, ms)
    end
    return REPLY
  end
  
  -- Phase one of several policies enforced (`decide_fused` in decide.lua), for the one at
  -- position i whose reply follows REPLY[base]: its verdict, remaining and reset in the
  -- reply; returns whether it admits and the state decided on.
  local function judged(key, p, now, cost, i, base)
    local st, ends, stale
    repeat -- load
      local raw = call('GET', key)
      if not raw then
        st, ends, stale = nil break
      end
      local bare
      repeat -- untagged
        local tag = p.tag
        if find(raw, tag, #raw - #tag + 1, true) then
          bare = sub(raw, 1, #raw - #tag) break
        end
        bare = nil break
      until true
      if bare then
        st, ends, stale = sw_read(bare, p[2] + 1) break
      end
      local tag, ends_32
      raw, tag, ends_32 = split_state(raw)
      if tag and tag ~= p.tag then
        local n = tag_params(tag, OLD_RING) and OLD_RING[2]
        st, ends, stale = n and sw_read(raw, n + 1), ends_32, tag break
      end
      st, ends, stale = sw_read(raw, p[2] + 1), ends_32 break
    until true
    if ends or stale then
      return nil
    end
    local ok, remaining, reset, retry
    repeat -- evaluate
      local limit, n, g = p[1], p[2], p[3]
      local c, x
      repeat -- sw_position
        local c_35
        do -- fdiv
          local a, b = now, p[3]
          c_35 = (a - a % b) / b
        end
        if st and st[1] > c_35 then
          c, x = st[1], 0 break
        end
        c, x = c_35, now - c_35 * p[3] break
      until true
      local used
      do -- sw_estimate
        local n, g = p[2], p[3]
        local whole = 0
        if st then
          local lo, hi = c + 1 - n, c
          if lo < 0 then
            lo = 0
          end
          if lo < st[1] - n then
            lo = st[1] - n
          end
          if hi > st[1] then
            hi = st[1]
          end
          local slots = n + 1
          local wraps
          do -- fdiv
            local a, b = lo, slots
            wraps = (a - a % b) / b
          end
          local slot = lo - wraps * slots
          for _ = lo, hi do
            whole = whole + st[slot + 2]
            slot = slot + 1
            if slot == slots then
              slot = 0
            end
          end
        end
        local oldest = 0
        if c >= n then
          repeat -- sw_count
            local index = c - n
            if st and index <= st[1] and index + p[2] >= st[1] then
              local wraps
              do -- fdiv
                local a, b = index, p[2] + 1
                wraps = (a - a % b) / b
              end
              local slot = index - wraps * (p[2] + 1)
              oldest = st[slot + 2] break
            end
            oldest = 0 break
          until true
        end
        local part
        do -- cdiv
          local a, b = oldest * (g - x), g
          part = (a + (-a) % b) / b
        end
        used = whole + part
      end
      local remaining_34 = limit - used
      if remaining_34 < 0 then
        remaining_34 = 0
      end
      if used + cost <= limit and cost > 0 then
        ok, remaining, reset, retry = 1, remaining_34 - cost, (n + 1) * g - x, -1 break
      end
      ok, remaining, reset, retry = sw_denied(p, st, c, x, cost, used, remaining_34) break
    until true
    local behind
    repeat -- lag
      if st and st[1] * p[3] > now then
        behind = st[1] * p[3] - now break
      end
      behind = 0 break
    until true
    if behind > 0 then
      do -- shift
        local lag, ok_43, remaining_43, reset_43, retry_43 = behind, ok, remaining, reset, retry
        if lag > 0 then
          remaining_43 = 0
          reset_43 = reset_43 + lag
          if retry_43 >= 0 then
            retry_43 = retry_43 + lag
          end
          if ok_43 == 1 and cost > 0 then
            ok_43, retry_43 = 0, lag
            if reset_43 < lag then
              reset_43 = lag
            end
          end
        end
        ok, remaining, reset, retry = ok_43, remaining_43, reset_43, retry_43
      end
    end
    REPLY[base + 2], REPLY[base + 3] = remaining, reset
    if ok == 1 then
      REPLY[base + 1] = -2
      return true, st
    end
    if retry < 0 then
      REPLY[base + 1] = -1
    else
      REPLY[base + 1] = retry
    end
    return false, st
  end
  
  return {
    fused = fused,
    judged = judged,
    block = block_in_value,
    load = load,
    -- Twin of `SlidingWindow::convert`: each old bucket still in the window moves, with its
    -- count, to the new bucket holding its last microsecond (the present's for the present's).
    convert = function(self, key, q, p, st, now)
      local n, g = p[2], p[3]
      local present = fdiv(now, g)
      local from = st[1] - q[2]
      if from < 0 then
        from = 0
      end
      local moved, head = {}, nil
      for i = from, st[1] do
        local count = sw_count(q, st, i)
        local j = fdiv(i * q[3], g)
        if present > j then
          j = present
        end
        local last = fdiv((i + 1) * q[3] - 1, g)
        if last < j then
          j = last
        end
        -- Kept while the new window counts it.
        if count > 0 and (j + n + 1) * g > now then
          moved[#moved + 1] = j
          moved[#moved + 1] = count
          if not head or j > head then
            head = j
          end
        end
      end
      if not head then
        return false
      end
      local slots = n + 1
      local ring = { head }
      for k = 2, slots + 1 do
        ring[k] = 0
      end
      for k = 1, #moved, 2 do
        local j = moved[k]
        if j + n < head then
          -- Older than the new ring holds: into its oldest bucket.
          j = head - n
        end
        local slot = j - fdiv(j, slots) * slots + 2
        local c = ring[slot] + moved[k + 1]
        if c > 4294967295 then
          c = 4294967295
        end
        ring[slot] = c
      end
      sw_write(key, p, head, ring, slots, now, (head + slots) * g)
      return true
    end,
    lag = lag,
    evaluate = evaluate,
    -- A lease ends with the bucket its units are counted in.
    lease_end = function(self, p, st, now, ttl)
      local g = p[3]
      local c = sw_position(p, st, now)
      local from = now
      if c * g > from then
        from = c * g
      end
      local e = from + ttl
      if e > (c + 1) * g - 1 then
        e = (c + 1) * g - 1
      end
      return e
    end,
    -- Gives back to the lease's bucket, while the ring still counts it.
    give_back = function(self, key, p, st, now, lease_end, units)
      if not st then
        return
      end
      local n, g = p[2], p[3]
      local slots = n + 1
      local b = fdiv(lease_end, g)
      local head = st[1]
      if b > head or b + n < head then
        return
      end
      local slot = b - fdiv(b, slots) * slots + 2
      local take = st[slot]
      if take > units then
        take = units
      end
      st[slot] = st[slot] - take
      sw_write(key, p, head, st, slots, now, (head + slots) * g)
    end,
    refund = function(self, key, p, st, now, units)
      if not st then
        return
      end
      local n, g = p[2], p[3]
      local slots = n + 1
      local c = sw_position(p, st, now)
      local head = st[1]
      local oldest = c - n
      if head - n > oldest then
        oldest = head - n
      end
      if oldest < 0 then
        oldest = 0
      end
      local i = head
      if c < i then
        i = c
      end
      local left = units
      while left > 0 and i >= oldest do
        local slot = i - fdiv(i, slots) * slots + 2
        local take = st[slot]
        if take > left then
          take = left
        end
        st[slot] = st[slot] - take
        left = left - take
        i = i - 1
      end
      sw_write(key, p, head, st, slots, now, (head + slots) * g)
    end,
    commit = commit,
  }
end
-- Sliding log: twin of sliding_log.rs. Params: limit, window. State: a sorted set with one
-- member per admitted unit, scored by its time; members are "time:sequence", the sequence
-- zero-padded so that members of one time sort by it, and numbered on from the newest member
-- of that time (never reused while that member exists, even after a refund).
-- A block is one more member, "block:end", scored +inf: always the highest, never inside a
-- window (counts stop short of +inf), so the read of the newest entry finds it too. A key's
-- own limit is another, "limit:TAG" (TAG: the parameters it is decided under, see
-- `own_params`), above the block.
ALG[3] = function()
  local LETTER_B = 98 -- the first byte of "block:"
  local LETTER_L = 108 -- the first byte of "limit:"

  -- In-window entries: scores after `cutoff`, short of the block's +inf.
  --@inline
  local function in_window(key, cutoff)
    local after = int(cutoff)
    return call('ZCOUNT', key, '(' .. after, '(+inf')
  end

  -- Logs `cost` units at `at` (now, or a lease's end) and drops the entries out of the window
  -- at `now`. The members of one time are numbered on from the highest there: the newest
  -- entry's when it has that time, else found with one more read (only when something newer
  -- than `at` is logged: a lease's units, or a clock that went back).
  --@inline
  local function log(key, p, st, now, at, cost)
    local window = p[2]
    local gone = int(now - window)
    call('ZREMRANGEBYSCORE', key, '-inf', gone)
    local seq = 0
    local t = int(at)
    if st and st[1] == at then
      seq = tonumber(match(st[2], ':(%d+)$')) or 0
    elseif st and st[1] > at then
      local top = call('ZREVRANGEBYSCORE', key, t, t, 'LIMIT', 0, 1)
      if top[1] then
        seq = tonumber(match(top[1], ':(%d+)$')) or 0
      end
    end
    if cost == 1 then
      call('ZADD', key, t, t .. ':' .. format('%010d', seq + 1))
    end
    -- One member per unit, added in batches (Lua's unpack has a small stack).
    local i = 1
    while cost > 1 and i <= cost do
      local args = {}
      local last = i + 499
      if last > cost then
        last = cost
      end
      for j = i, last do
        args[#args + 1] = t
        args[#args + 1] = t .. ':' .. format('%010d', seq + j)
      end
      call('ZADD', key, unpack(args))
      i = last + 1
    end
    local newest = now
    if st and st[1] > newest then
      newest = st[1]
    end
    if cost > 0 and at > newest then
      newest = at
    end
    local expires_at = until_block_ends(newest + window)
    if p.limit_end and p.limit_end > expires_at then
      expires_at = p.limit_end
    end
    local ms = ttl_ms(now, expires_at)
    call('PEXPIRE', key, format(INT, ms))
  end

  -- The newest entry (in `into`), the end of the block on record, if any, and the tag of the
  -- key's own limit, if it has one (read as a state written under other parameters).
  --@inline
  local function load(key, p, now, into)
    local top = call('ZRANGE', key, -2, -1, 'WITHSCORES')
    local n = #top
    if n == 0 then
      return nil
    end
    local ends, own
    if byte(top[n - 1], 1) == LETTER_L then
      own = sub(top[n - 1], 7)
      top = call('ZRANGE', key, -3, -2, 'WITHSCORES')
      n = #top
    end
    if n > 0 and byte(top[n - 1], 1) == LETTER_B then
      ends = tonumber(sub(top[n - 1], 7))
      n = n - 2
    end
    if n == 0 then
      return nil, ends, own
    end
    into[1], into[2] = tonumber(top[n]), top[n - 1]
    return into, ends, own
  end

  --@inline
  local function evaluate(self, p, st, now, cost, key)
    local limit, window = p[1], p[2]
    if not st then
      if cost > limit then
        return 0, limit, 0, -1
      end
      local reset = 0
      if cost > 0 then
        reset = window
      end
      return 1, limit - cost, reset, -1
    end
    local used = in_window(key, now - window)
    local newest_left = 0
    if used > 0 then
      newest_left = st[1] + window - now
    end
    local left = limit - used
    if left < 0 then
      left = 0
    end
    if cost > limit then
      return 0, left, newest_left, -1
    end
    if used + cost <= limit then
      local reset = newest_left
      if cost > 0 then
        reset = window
      end
      return 1, limit - used - cost, reset, -1
    end
    -- The entry whose leaving the window makes room.
    local need = used + cost - limit
    local since = int(now - window)
    local entry = call('ZRANGEBYSCORE', key, '(' .. since, '(+inf', 'WITHSCORES', 'LIMIT', need - 1, 1)
    return 0, left, newest_left, tonumber(entry[2]) + window - now
  end

  --@inline
  local function commit(self, key, p, st, now, cost)
    log(key, p, st, now, now, cost)
  end

  -- The fused decisions of policies enforced (`FUSES[op]`), the usual request: the phases of
  -- `decide` for that case, in functions per algorithm. The generator (luagen/) writes them
  -- into each twin, with the twin's own `load`, `evaluate`, `commit` and `lag` written in place
  -- of their calls. A key blocked, or written under other parameters, is left to the general
  -- path: nil, having written nothing.
  
  -- One policy alone. `args` are the policy's arguments, `shape` their first.
  local function fused(key, args, shape)
    local cost, at = 1, 2
    if shape % 2048 >= 1024 then
      cost = tonumber(args[2])
      at = 3
    end
    local p
    do -- read_params
      local tag = args[at]
      local p_1 = TAGGED[tag or '']
      if not p_1 and tag then
        local semi = find(tag, ';', 1, true)
        p_1 = { tag = semi and sub(tag, 1, semi - 1) or tag }
        if not tag_params(tag, p_1) then
          p_1 = nil
        else
          remember(tag, p_1)
        end
      end
      p = p_1
    end
    if not p then
      return nil
    end
    local now
    repeat -- clock
      local injected = shape >= 2048
      if injected then
        TTL_SLACK = tonumber(args[#args])
        now = tonumber(args[#args - 1]) break
      end
      TTL_SLACK = 0
      local t = call('TIME')
      now = t[1] * 1000000 + t[2] break
    until true
    local st, ends, stale
    repeat -- load
      local into = STATES[1]
      local top = call('ZRANGE', key, -2, -1, 'WITHSCORES')
      local n = #top
      if n == 0 then
        st, ends, stale = nil break
      end
      local ends_3, own
      if byte(top[n - 1], 1) == LETTER_L then
        own = sub(top[n - 1], 7)
        top = call('ZRANGE', key, -3, -2, 'WITHSCORES')
        n = #top
      end
      if n > 0 and byte(top[n - 1], 1) == LETTER_B then
        ends_3 = tonumber(sub(top[n - 1], 7))
        n = n - 2
      end
      if n == 0 then
        st, ends, stale = nil, ends_3, own break
      end
      into[1], into[2] = tonumber(top[n]), top[n - 1]
      st, ends, stale = into, ends_3, own break
    until true
    if ends or stale then
      return nil
    end
    local ok, remaining, reset, retry
    repeat -- evaluate
      local limit, window = p[1], p[2]
      if not st then
        if cost > limit then
          ok, remaining, reset, retry = 0, limit, 0, -1 break
        end
        local reset_4 = 0
        if cost > 0 then
          reset_4 = window
        end
        ok, remaining, reset, retry = 1, limit - cost, reset_4, -1 break
      end
      local used
      do -- in_window
        local cutoff = now - window
        local after
        do -- int
          local n = cutoff
          after = format(INT, n)
        end
        used = call('ZCOUNT', key, '(' .. after, '(+inf')
      end
      local newest_left = 0
      if used > 0 then
        newest_left = st[1] + window - now
      end
      local left = limit - used
      if left < 0 then
        left = 0
      end
      if cost > limit then
        ok, remaining, reset, retry = 0, left, newest_left, -1 break
      end
      if used + cost <= limit then
        local reset_4 = newest_left
        if cost > 0 then
          reset_4 = window
        end
        ok, remaining, reset, retry = 1, limit - used - cost, reset_4, -1 break
      end
      local need = used + cost - limit
      local since
      do -- int
        local n = now - window
        since = format(INT, n)
      end
      local entry = call('ZRANGEBYSCORE', key, '(' .. since, '(+inf', 'WITHSCORES', 'LIMIT', need - 1, 1)
      ok, remaining, reset, retry = 0, left, newest_left, tonumber(entry[2]) + window - now break
    until true
    REPLY[2], REPLY[3], REPLY[3 + 1] = remaining, reset, nil
    if ok ~= 1 then
      if retry < 0 then
        REPLY[1] = -1
      else
        REPLY[1] = retry
      end
    else
      REPLY[1] = -2
      if cost > 0 then
        repeat -- commit
          repeat -- log
            local at = now
            local window = p[2]
            local gone
            do -- int
              local n = now - window
              gone = format(INT, n)
            end
            call('ZREMRANGEBYSCORE', key, '-inf', gone)
            local seq = 0
            local t
            do -- int
              local n = at
              t = format(INT, n)
            end
            if st and st[1] == at then
              seq = tonumber(match(st[2], ':(%d+)$')) or 0
            elseif st and st[1] > at then
              local top = call('ZREVRANGEBYSCORE', key, t, t, 'LIMIT', 0, 1)
              if top[1] then
                seq = tonumber(match(top[1], ':(%d+)$')) or 0
              end
            end
            if cost == 1 then
              call('ZADD', key, t, t .. ':' .. format('%010d', seq + 1))
            end
            local i = 1
            while cost > 1 and i <= cost do
              local args = {}
              local last = i + 499
              if last > cost then
                last = cost
              end
              for j = i, last do
                args[#args + 1] = t
                args[#args + 1] = t .. ':' .. format('%010d', seq + j)
              end
              call('ZADD', key, unpack(args))
              i = last + 1
            end
            local newest = now
            if st and st[1] > newest then
              newest = st[1]
            end
            if cost > 0 and at > newest then
              newest = at
            end
            local expires_at
            repeat -- until_block_ends
              local expires_at_12 = newest + window
              if KEEP_BLOCK and KEEP_BLOCK > expires_at_12 then
                expires_at = KEEP_BLOCK break
              end
              expires_at = expires_at_12 break
            until true
            if p.limit_end and p.limit_end > expires_at then
              expires_at = p.limit_end
            end
            local ms
            repeat -- ttl_ms
              local ms_13
              do -- cdiv
                local a, b = expires_at - now, 1000
                ms_13 = (a + (-a) % b) / b
              end
              ms_13 = ms_13 + TTL_SLACK
              if ms_13 < 1 then
                ms = 1 break
              end
              ms = ms_13 break
            until true
            call('PEXPIRE', key, format(INT, ms))
          until true
        until true
        return REPLY
      end
    end
    -- Not charged: a key that lost its TTL gets one (as `apply` does).
    if call('PTTL', key) == -1 then
      local ms
      repeat -- ttl_ms
        local expires_at = now + reset
        local ms_15
        do -- cdiv
          local a, b = expires_at - now, 1000
          ms_15 = (a + (-a) % b) / b
        end
        ms_15 = ms_15 + TTL_SLACK
        if ms_15 < 1 then
          ms = 1 break
        end
        ms = ms_15 break
      until true
      call('PEXPIRE', key, ms)
    end
    return REPLY
  end
  
  -- Phase one of several policies enforced (`decide_fused` in decide.lua), for the one at
  -- position i whose reply follows REPLY[base]: its verdict, remaining and reset in the
  -- reply; returns whether it admits and the state decided on.
  local function judged(key, p, now, cost, i, base)
    local st, ends, stale
    repeat -- load
      local into = STATES[i]
      local top = call('ZRANGE', key, -2, -1, 'WITHSCORES')
      local n = #top
      if n == 0 then
        st, ends, stale = nil break
      end
      local ends_17, own
      if byte(top[n - 1], 1) == LETTER_L then
        own = sub(top[n - 1], 7)
        top = call('ZRANGE', key, -3, -2, 'WITHSCORES')
        n = #top
      end
      if n > 0 and byte(top[n - 1], 1) == LETTER_B then
        ends_17 = tonumber(sub(top[n - 1], 7))
        n = n - 2
      end
      if n == 0 then
        st, ends, stale = nil, ends_17, own break
      end
      into[1], into[2] = tonumber(top[n]), top[n - 1]
      st, ends, stale = into, ends_17, own break
    until true
    if ends or stale then
      return nil
    end
    local ok, remaining, reset, retry
    repeat -- evaluate
      local limit, window = p[1], p[2]
      if not st then
        if cost > limit then
          ok, remaining, reset, retry = 0, limit, 0, -1 break
        end
        local reset_18 = 0
        if cost > 0 then
          reset_18 = window
        end
        ok, remaining, reset, retry = 1, limit - cost, reset_18, -1 break
      end
      local used
      do -- in_window
        local cutoff = now - window
        local after
        do -- int
          local n = cutoff
          after = format(INT, n)
        end
        used = call('ZCOUNT', key, '(' .. after, '(+inf')
      end
      local newest_left = 0
      if used > 0 then
        newest_left = st[1] + window - now
      end
      local left = limit - used
      if left < 0 then
        left = 0
      end
      if cost > limit then
        ok, remaining, reset, retry = 0, left, newest_left, -1 break
      end
      if used + cost <= limit then
        local reset_18 = newest_left
        if cost > 0 then
          reset_18 = window
        end
        ok, remaining, reset, retry = 1, limit - used - cost, reset_18, -1 break
      end
      local need = used + cost - limit
      local since
      do -- int
        local n = now - window
        since = format(INT, n)
      end
      local entry = call('ZRANGEBYSCORE', key, '(' .. since, '(+inf', 'WITHSCORES', 'LIMIT', need - 1, 1)
      ok, remaining, reset, retry = 0, left, newest_left, tonumber(entry[2]) + window - now break
    until true
    REPLY[base + 2], REPLY[base + 3] = remaining, reset
    if ok == 1 then
      REPLY[base + 1] = -2
      return true, st
    end
    if retry < 0 then
      REPLY[base + 1] = -1
    else
      REPLY[base + 1] = retry
    end
    return false, st
  end
  
  return {
    fused = fused,
    judged = judged,
    load = load,
    -- The key's own limit, `to` (nil: none): its member replaced, the key living until it
    -- ends.
    mark = function(self, key, to, now)
      self.unmark(key, LETTER_L)
      if to.limit_end then
        call('ZADD', key, '+inf', 'limit:' .. to.tag)
        local ms = ttl_ms(now, to.limit_end)
        if call('PTTL', key) < ms then
          call('PEXPIRE', key, format(INT, ms))
        end
      end
    end,
    -- Removes the member at +inf that starts with `letter` (the block or the limit; the
    -- limit sorts last), by its rank: the commands the decision's ACL line allows.
    unmark = function(key, letter)
      local top = call('ZRANGEBYSCORE', key, '+inf', '+inf')
      for i = #top, 1, -1 do
        if byte(top[i], 1) == letter then
          local rank = i - #top - 1
          call('ZREMRANGEBYRANK', key, rank, rank)
          return
        end
      end
    end,
    block = function(self, key, p, st, now, ends)
      self.unmark(key, LETTER_B)
      call('ZADD', key, '+inf', 'block:' .. int(ends))
      call('PEXPIRE', key, ttl_to_block_end(key, now, ends))
    end,
    evaluate = evaluate,
    -- Forgets up to `units` of the newest entries at or before `now` (later ones are a
    -- lease's): they have the highest ranks of those.
    refund = function(self, key, p, st, now, units)
      if st and units > 0 then
        local entries = call('ZCOUNT', key, '-inf', int(now))
        local from = entries - units
        if from < 0 then
          from = 0
        end
        if entries > 0 then
          call('ZREMRANGEBYRANK', key, from, entries - 1)
        end
      end
    end,
    commit = commit,
    -- A lease's units are logged at its end.
    lease_commit = function(self, key, p, st, now, ends, units)
      log(key, p, st, now, ends, units)
    end,
    -- A reserved request's units are logged at its slot, as a lease's at its end.
    reserve_commit = function(self, key, p, st, now, at, cost)
      log(key, p, st, now, at, cost)
    end,
    -- Forgets up to `units` of those logged at the lease's end (`ends`).
    give_back = function(self, key, p, st, now, ends, units)
      if st and units > 0 then
        -- The entries at `ends` hold the ranks after those before it.
        local at = int(ends)
        local before = call('ZCOUNT', key, '-inf', '(' .. at)
        local here = call('ZCOUNT', key, at, at)
        local take = units
        if take > here then
          take = here
        end
        if take > 0 then
          call('ZREMRANGEBYRANK', key, before + here - take, before + here - 1)
        end
      end
    end,
  }
end
-- Token bucket: twin of token_bucket.rs. Params: capacity, unit, rate, full.
-- State: "tokens last" (tokens in scaled units).
-- Built when a decision first uses it (`algorithm` in decide.lua).
ALG[4] = function()
  --@inline
  local load = read2

  --@inline
  local lag = bucket_lag

  --@inline
  local function fill(p, amount, elapsed)
    local full, rate = p[4], p[3]
    local a = amount
    if a > full then
      a = full
    end
    local to_full = cdiv(full - a, rate)
    if elapsed >= to_full then
      return full
    end
    return amount + elapsed * rate
  end

  --@inline
  local function elapsed_since(st, now)
    local e = now - st[2]
    if e < 0 then
      return 0
    end
    return e
  end

  -- The tokens in the bucket now.
  --@inline
  local function tokens(p, st, now)
    if not st then
      return p[4]
    end
    local elapsed = elapsed_since(st, now)
    local have = fill(p, st[1], elapsed)
    return have
  end

  --@inline
  local function evaluate(self, p, st, now, cost)
    local capacity, unit, rate, full = p[1], p[2], p[3], p[4]
    local have = tokens(p, st, now)
    local need = cost * unit
    if cost <= capacity and have >= need then
      local left = have - need
      local whole = fdiv(left, unit)
      local reset = cdiv(full - left, rate)
      return 1, whole, reset, -1
    end
    -- Denied: what is left now, and when the bucket is full again.
    local whole = fdiv(have, unit)
    local reset = cdiv(full - have, rate)
    if cost > capacity then
      return 0, whole, reset, -1
    end
    local retry = cdiv(need - have, rate)
    return 0, whole, reset, retry
  end

  --@inline
  local function commit(self, key, p, st, now, cost)
    local have = tokens(p, st, now)
    have = have - cost * p[2]
    if have < 0 then
      have = 0
    end
    local last = last_after(st, now)
    local to_full = cdiv(p[4] - have, p[3])
    store(key, p, format(INT2, have, last), now, last + to_full)
  end

  -- The fused decisions of policies enforced (`FUSES[op]`), the usual request: the phases of
  -- `decide` for that case, in functions per algorithm. The generator (luagen/) writes them
  -- into each twin, with the twin's own `load`, `evaluate`, `commit` and `lag` written in place
  -- of their calls. A key blocked, or written under other parameters, is left to the general
  -- path: nil, having written nothing.
  
  -- One policy alone. `args` are the policy's arguments, `shape` their first.
  local function fused(key, args, shape)
    local cost, at = 1, 2
    if shape % 2048 >= 1024 then
      cost = tonumber(args[2])
      at = 3
    end
    local p
    do -- read_params
      local tag = args[at]
      local p_1 = TAGGED[tag or '']
      if not p_1 and tag then
        local semi = find(tag, ';', 1, true)
        p_1 = { tag = semi and sub(tag, 1, semi - 1) or tag }
        if not tag_params(tag, p_1) then
          p_1 = nil
        else
          remember(tag, p_1)
        end
      end
      p = p_1
    end
    if not p then
      return nil
    end
    local now
    repeat -- clock
      local injected = shape >= 2048
      if injected then
        TTL_SLACK = tonumber(args[#args])
        now = tonumber(args[#args - 1]) break
      end
      TTL_SLACK = 0
      local t = call('TIME')
      now = t[1] * 1000000 + t[2] break
    until true
    local st, ends, stale
    repeat -- read2
      local into = STATES[1]
      local raw = call('GET', key)
      if not raw then
        st, ends, stale = nil break
      end
      local a, b, tag, ends_3
      local t = p.tag
      if find(raw, t, #raw - #t + 1, true) then
        a, b = match(raw, '^(%d+) (%d+)~')
      end
      if not a then
        local state
        state, tag, ends_3 = split_state(raw)
        if tag == p.tag then
          tag = nil
        end
        a, b = match(state or '', '^(%d+) (%d+)$')
        if not a then
          st, ends, stale = nil, ends_3, tag break
        end
      end
      into[1], into[2] = tonumber(a), tonumber(b)
      st, ends, stale = into, ends_3, tag break
    until true
    if ends or stale then
      return nil
    end
    local ok, remaining, reset, retry
    repeat -- evaluate
      local capacity, unit, rate, full = p[1], p[2], p[3], p[4]
      local have
      repeat -- tokens
        if not st then
          have = p[4] break
        end
        local elapsed
        repeat -- elapsed_since
          local e = now - st[2]
          if e < 0 then
            elapsed = 0 break
          end
          elapsed = e break
        until true
        local have_5
        repeat -- fill
          local amount = st[1]
          local full, rate = p[4], p[3]
          local a = amount
          if a > full then
            a = full
          end
          local to_full
          do -- cdiv
            local a, b = full - a, rate
            to_full = (a + (-a) % b) / b
          end
          if elapsed >= to_full then
            have_5 = full break
          end
          have_5 = amount + elapsed * rate break
        until true
        have = have_5 break
      until true
      local need = cost * unit
      if cost <= capacity and have >= need then
        local left = have - need
        local whole
        do -- fdiv
          local a, b = left, unit
          whole = (a - a % b) / b
        end
        local reset_4
        do -- cdiv
          local a, b = full - left, rate
          reset_4 = (a + (-a) % b) / b
        end
        ok, remaining, reset, retry = 1, whole, reset_4, -1 break
      end
      local whole
      do -- fdiv
        local a, b = have, unit
        whole = (a - a % b) / b
      end
      local reset_4
      do -- cdiv
        local a, b = full - have, rate
        reset_4 = (a + (-a) % b) / b
      end
      if cost > capacity then
        ok, remaining, reset, retry = 0, whole, reset_4, -1 break
      end
      local retry_4
      do -- cdiv
        local a, b = need - have, rate
        retry_4 = (a + (-a) % b) / b
      end
      ok, remaining, reset, retry = 0, whole, reset_4, retry_4 break
    until true
    local behind
    do -- bucket_lag
      local last
      repeat -- last_after
        if st and st[2] > now then
          last = st[2] break
        end
        last = now break
      until true
      behind = last - now
    end
    if behind > 0 then
      do -- shift
        local lag, ok_16, remaining_16, reset_16, retry_16 = behind, ok, remaining, reset, retry
        if lag > 0 then
          remaining_16 = 0
          reset_16 = reset_16 + lag
          if retry_16 >= 0 then
            retry_16 = retry_16 + lag
          end
          if ok_16 == 1 and cost > 0 then
            ok_16, retry_16 = 0, lag
            if reset_16 < lag then
              reset_16 = lag
            end
          end
        end
        ok, remaining, reset, retry = ok_16, remaining_16, reset_16, retry_16
      end
    end
    REPLY[2], REPLY[3], REPLY[3 + 1] = remaining, reset, nil
    if ok ~= 1 then
      if retry < 0 then
        REPLY[1] = -1
      else
        REPLY[1] = retry
      end
    else
      REPLY[1] = -2
      if cost > 0 then
        repeat -- commit
          local have
          repeat -- tokens
            if not st then
              have = p[4] break
            end
            local elapsed
            repeat -- elapsed_since
              local e = now - st[2]
              if e < 0 then
                elapsed = 0 break
              end
              elapsed = e break
            until true
            local have_18
            repeat -- fill
              local amount = st[1]
              local full, rate = p[4], p[3]
              local a = amount
              if a > full then
                a = full
              end
              local to_full
              do -- cdiv
                local a, b = full - a, rate
                to_full = (a + (-a) % b) / b
              end
              if elapsed >= to_full then
                have_18 = full break
              end
              have_18 = amount + elapsed * rate break
            until true
            have = have_18 break
          until true
          have = have - cost * p[2]
          if have < 0 then
            have = 0
          end
          local last
          repeat -- last_after
            if st and st[2] > now then
              last = st[2] break
            end
            last = now break
          until true
          local to_full
          do -- cdiv
            local a, b = p[4] - have, p[3]
            to_full = (a + (-a) % b) / b
          end
          repeat -- store
            local value, expires_at = format(INT2, have, last), last + to_full
            value = value .. p.tag
            if p.limit_end and p.limit_end > expires_at then
              expires_at = p.limit_end
            end
            if KEEP_BLOCK then
              local block_end
              do -- int
                local n = KEEP_BLOCK
                block_end = format(INT, n)
              end
              value = value .. '|' .. block_end
              repeat -- until_block_ends
                local expires_at_26 = expires_at
                if KEEP_BLOCK and KEEP_BLOCK > expires_at_26 then
                  expires_at = KEEP_BLOCK break
                end
                expires_at = expires_at_26 break
              until true
            end
            local ms
            repeat -- ttl_ms
              local ms_27
              do -- cdiv
                local a, b = expires_at - now, 1000
                ms_27 = (a + (-a) % b) / b
              end
              ms_27 = ms_27 + TTL_SLACK
              if ms_27 < 1 then
                ms = 1 break
              end
              ms = ms_27 break
            until true
            call('SET', key, value, 'PX', format(INT, ms))
          until true
        until true
        return REPLY
      end
    end
    -- Not charged: a key that lost its TTL gets one (as `apply` does).
    if call('PTTL', key) == -1 then
      local ms
      repeat -- ttl_ms
        local expires_at = now + reset
        local ms_29
        do -- cdiv
          local a, b = expires_at - now, 1000
          ms_29 = (a + (-a) % b) / b
        end
        ms_29 = ms_29 + TTL_SLACK
        if ms_29 < 1 then
          ms = 1 break
        end
        ms = ms_29 break
      until true
      call('PEXPIRE', key, ms)
    end
    return REPLY
  end
  
  -- Phase one of several policies enforced (`decide_fused` in decide.lua), for the one at
  -- position i whose reply follows REPLY[base]: its verdict, remaining and reset in the
  -- reply; returns whether it admits and the state decided on.
  local function judged(key, p, now, cost, i, base)
    local st, ends, stale
    repeat -- read2
      local into = STATES[i]
      local raw = call('GET', key)
      if not raw then
        st, ends, stale = nil break
      end
      local a, b, tag, ends_31
      local t = p.tag
      if find(raw, t, #raw - #t + 1, true) then
        a, b = match(raw, '^(%d+) (%d+)~')
      end
      if not a then
        local state
        state, tag, ends_31 = split_state(raw)
        if tag == p.tag then
          tag = nil
        end
        a, b = match(state or '', '^(%d+) (%d+)$')
        if not a then
          st, ends, stale = nil, ends_31, tag break
        end
      end
      into[1], into[2] = tonumber(a), tonumber(b)
      st, ends, stale = into, ends_31, tag break
    until true
    if ends or stale then
      return nil
    end
    local ok, remaining, reset, retry
    repeat -- evaluate
      local capacity, unit, rate, full = p[1], p[2], p[3], p[4]
      local have
      repeat -- tokens
        if not st then
          have = p[4] break
        end
        local elapsed
        repeat -- elapsed_since
          local e = now - st[2]
          if e < 0 then
            elapsed = 0 break
          end
          elapsed = e break
        until true
        local have_33
        repeat -- fill
          local amount = st[1]
          local full, rate = p[4], p[3]
          local a = amount
          if a > full then
            a = full
          end
          local to_full
          do -- cdiv
            local a, b = full - a, rate
            to_full = (a + (-a) % b) / b
          end
          if elapsed >= to_full then
            have_33 = full break
          end
          have_33 = amount + elapsed * rate break
        until true
        have = have_33 break
      until true
      local need = cost * unit
      if cost <= capacity and have >= need then
        local left = have - need
        local whole
        do -- fdiv
          local a, b = left, unit
          whole = (a - a % b) / b
        end
        local reset_32
        do -- cdiv
          local a, b = full - left, rate
          reset_32 = (a + (-a) % b) / b
        end
        ok, remaining, reset, retry = 1, whole, reset_32, -1 break
      end
      local whole
      do -- fdiv
        local a, b = have, unit
        whole = (a - a % b) / b
      end
      local reset_32
      do -- cdiv
        local a, b = full - have, rate
        reset_32 = (a + (-a) % b) / b
      end
      if cost > capacity then
        ok, remaining, reset, retry = 0, whole, reset_32, -1 break
      end
      local retry_32
      do -- cdiv
        local a, b = need - have, rate
        retry_32 = (a + (-a) % b) / b
      end
      ok, remaining, reset, retry = 0, whole, reset_32, retry_32 break
    until true
    local behind
    do -- bucket_lag
      local last
      repeat -- last_after
        if st and st[2] > now then
          last = st[2] break
        end
        last = now break
      until true
      behind = last - now
    end
    if behind > 0 then
      do -- shift
        local lag, ok_44, remaining_44, reset_44, retry_44 = behind, ok, remaining, reset, retry
        if lag > 0 then
          remaining_44 = 0
          reset_44 = reset_44 + lag
          if retry_44 >= 0 then
            retry_44 = retry_44 + lag
          end
          if ok_44 == 1 and cost > 0 then
            ok_44, retry_44 = 0, lag
            if reset_44 < lag then
              reset_44 = lag
            end
          end
        end
        ok, remaining, reset, retry = ok_44, remaining_44, reset_44, retry_44
      end
    end
    REPLY[base + 2], REPLY[base + 3] = remaining, reset
    if ok == 1 then
      REPLY[base + 1] = -2
      return true, st
    end
    if retry < 0 then
      REPLY[base + 1] = -1
    else
      REPLY[base + 1] = retry
    end
    return false, st
  end
  
  return {
    fused = fused,
    judged = judged,
    block = block_in_value,
    load = load,
    tokens = tokens,
    lag = lag,
    evaluate = evaluate,
    -- No more tokens than a bucket with room for the refill until the lease's end.
    lease_state = function(self, p, st, now, lease_end, into)
      local tokens = self.tokens(p, st, now)
      local cap = p[4] - fill(p, 0, lease_end - now)
      if tokens > cap then
        tokens = cap
      end
      into[1], into[2] = tokens, last_after(st, now)
      return into
    end,
    -- Twin of `TokenBucket::convert`: the tokens missing now (and owed, ahead of now)
    -- re-counted in the new unit; more than the capacity is owed as time ahead.
    convert = function(self, key, q, p, st, now)
      local tokens = st[1]
      if tokens > q[4] then
        tokens = q[4]
      end
      local missing
      if st[2] > now then
        missing = q[4] - tokens + (st[2] - now) * q[3]
      else
        missing = q[4] - self.tokens(q, st, now)
        if missing < 0 then
          missing = 0
        end
      end
      if missing == 0 then
        return false
      end
      missing = rescale(missing, q[2], p[2])
      local last = now
      tokens = p[4] - missing
      if tokens < 0 then
        last = now + cdiv(-tokens, p[3])
        tokens = 0
      end
      store(key, p, format(INT2, tokens, last), now, last + cdiv(p[4] - tokens, p[3]))
      return true
    end,
    release = bucket_release,
    refund = function(self, key, p, st, now, units)
      if not st then
        return
      end
      local tokens = self.tokens(p, st, now)
      if units >= p[1] then
        tokens = p[4]
      else
        tokens = tokens + units * p[2]
        if tokens > p[4] then
          tokens = p[4]
        end
      end
      local last = last_after(st, now)
      store(key, p, format(INT2, tokens, last), now, last + cdiv(p[4] - tokens, p[3]))
    end,
    -- Twin of `TokenBucket::debit`: what the bucket lacks is owed as time ahead.
    debit = function(self, key, p, st, now, units)
      local have = self.tokens(p, st, now) - units * p[2]
      local last = last_after(st, now)
      if have < 0 then
        last = last + cdiv(-have, p[3])
        have = 0
      end
      store(key, p, format(INT2, have, last), now, last + cdiv(p[4] - have, p[3]))
    end,
    commit = commit,
  }
end
-- Leaky bucket (meter): twin of leaky_bucket.rs. Params: capacity, unit, rate, full.
-- State: "level last" (level in scaled units).
-- Built when a decision first uses it (`algorithm` in decide.lua).
ALG[5] = function()
  --@inline
  local load = read2

  --@inline
  local lag = bucket_lag

  -- The level of the bucket now.
  --@inline
  local function level(p, st, now)
    if not st then
      return 0
    end
    local elapsed = now - st[2]
    if elapsed < 0 then
      elapsed = 0
    end
    local to_empty = cdiv(st[1], p[3])
    if elapsed >= to_empty then
      return 0
    end
    return st[1] - elapsed * p[3]
  end

  --@inline
  local function evaluate(self, p, st, now, cost)
    local capacity, unit, rate, full = p[1], p[2], p[3], p[4]
    local now_level = level(p, st, now)
    local room = full - now_level
    if room < 0 then
      room = 0
    end
    local after = now_level + cost * unit
    if cost <= capacity and after <= full then
      local left = fdiv(full - after, unit)
      local reset = cdiv(after, rate)
      return 1, left, reset, -1
    end
    -- Denied: the room left now, and when the bucket is empty.
    local left = fdiv(room, unit)
    local reset = cdiv(now_level, rate)
    if cost > capacity then
      return 0, left, reset, -1
    end
    local retry = cdiv(after - full, rate)
    return 0, left, reset, retry
  end

  --@inline
  local function commit(self, key, p, st, now, cost)
    local after = level(p, st, now)
    after = after + cost * p[2]
    local last = last_after(st, now)
    local to_empty = cdiv(after, p[3])
    store(key, p, format(INT2, after, last), now, last + to_empty)
  end

  -- The fused decisions of policies enforced (`FUSES[op]`), the usual request: the phases of
  -- `decide` for that case, in functions per algorithm. The generator (luagen/) writes them
  -- into each twin, with the twin's own `load`, `evaluate`, `commit` and `lag` written in place
  -- of their calls. A key blocked, or written under other parameters, is left to the general
  -- path: nil, having written nothing.
  
  -- One policy alone. `args` are the policy's arguments, `shape` their first.
  local function fused(key, args, shape)
    local cost, at = 1, 2
    if shape % 2048 >= 1024 then
      cost = tonumber(args[2])
      at = 3
    end
    local p
    do -- read_params
      local tag = args[at]
      local p_1 = TAGGED[tag or '']
      if not p_1 and tag then
        local semi = find(tag, ';', 1, true)
        p_1 = { tag = semi and sub(tag, 1, semi - 1) or tag }
        if not tag_params(tag, p_1) then
          p_1 = nil
        else
          remember(tag, p_1)
        end
      end
      p = p_1
    end
    if not p then
      return nil
    end
    local now
    repeat -- clock
      local injected = shape >= 2048
      if injected then
        TTL_SLACK = tonumber(args[#args])
        now = tonumber(args[#args - 1]) break
      end
      TTL_SLACK = 0
      local t = call('TIME')
      now = t[1] * 1000000 + t[2] break
    until true
    local st, ends, stale
    repeat -- read2
      local into = STATES[1]
      local raw = call('GET', key)
      if not raw then
        st, ends, stale = nil break
      end
      local a, b, tag, ends_3
      local t = p.tag
      if find(raw, t, #raw - #t + 1, true) then
        a, b = match(raw, '^(%d+) (%d+)~')
      end
      if not a then
        local state
        state, tag, ends_3 = split_state(raw)
        if tag == p.tag then
          tag = nil
        end
        a, b = match(state or '', '^(%d+) (%d+)$')
        if not a then
          st, ends, stale = nil, ends_3, tag break
        end
      end
      into[1], into[2] = tonumber(a), tonumber(b)
      st, ends, stale = into, ends_3, tag break
    until true
    if ends or stale then
      return nil
    end
    local ok, remaining, reset, retry
    repeat -- evaluate
      local capacity, unit, rate, full = p[1], p[2], p[3], p[4]
      local now_level
      repeat -- level
        if not st then
          now_level = 0 break
        end
        local elapsed = now - st[2]
        if elapsed < 0 then
          elapsed = 0
        end
        local to_empty
        do -- cdiv
          local a, b = st[1], p[3]
          to_empty = (a + (-a) % b) / b
        end
        if elapsed >= to_empty then
          now_level = 0 break
        end
        now_level = st[1] - elapsed * p[3] break
      until true
      local room = full - now_level
      if room < 0 then
        room = 0
      end
      local after = now_level + cost * unit
      if cost <= capacity and after <= full then
        local left
        do -- fdiv
          local a, b = full - after, unit
          left = (a - a % b) / b
        end
        local reset_4
        do -- cdiv
          local a, b = after, rate
          reset_4 = (a + (-a) % b) / b
        end
        ok, remaining, reset, retry = 1, left, reset_4, -1 break
      end
      local left
      do -- fdiv
        local a, b = room, unit
        left = (a - a % b) / b
      end
      local reset_4
      do -- cdiv
        local a, b = now_level, rate
        reset_4 = (a + (-a) % b) / b
      end
      if cost > capacity then
        ok, remaining, reset, retry = 0, left, reset_4, -1 break
      end
      local retry_4
      do -- cdiv
        local a, b = after - full, rate
        retry_4 = (a + (-a) % b) / b
      end
      ok, remaining, reset, retry = 0, left, reset_4, retry_4 break
    until true
    local behind
    do -- bucket_lag
      local last
      repeat -- last_after
        if st and st[2] > now then
          last = st[2] break
        end
        last = now break
      until true
      behind = last - now
    end
    if behind > 0 then
      do -- shift
        local lag, ok_14, remaining_14, reset_14, retry_14 = behind, ok, remaining, reset, retry
        if lag > 0 then
          remaining_14 = 0
          reset_14 = reset_14 + lag
          if retry_14 >= 0 then
            retry_14 = retry_14 + lag
          end
          if ok_14 == 1 and cost > 0 then
            ok_14, retry_14 = 0, lag
            if reset_14 < lag then
              reset_14 = lag
            end
          end
        end
        ok, remaining, reset, retry = ok_14, remaining_14, reset_14, retry_14
      end
    end
    REPLY[2], REPLY[3], REPLY[3 + 1] = remaining, reset, nil
    if ok ~= 1 then
      if retry < 0 then
        REPLY[1] = -1
      else
        REPLY[1] = retry
      end
    else
      REPLY[1] = -2
      if cost > 0 then
        repeat -- commit
          local after
          repeat -- level
            if not st then
              after = 0 break
            end
            local elapsed = now - st[2]
            if elapsed < 0 then
              elapsed = 0
            end
            local to_empty
            do -- cdiv
              local a, b = st[1], p[3]
              to_empty = (a + (-a) % b) / b
            end
            if elapsed >= to_empty then
              after = 0 break
            end
            after = st[1] - elapsed * p[3] break
          until true
          after = after + cost * p[2]
          local last
          repeat -- last_after
            if st and st[2] > now then
              last = st[2] break
            end
            last = now break
          until true
          local to_empty
          do -- cdiv
            local a, b = after, p[3]
            to_empty = (a + (-a) % b) / b
          end
          repeat -- store
            local value, expires_at = format(INT2, after, last), last + to_empty
            value = value .. p.tag
            if p.limit_end and p.limit_end > expires_at then
              expires_at = p.limit_end
            end
            if KEEP_BLOCK then
              local block_end
              do -- int
                local n = KEEP_BLOCK
                block_end = format(INT, n)
              end
              value = value .. '|' .. block_end
              repeat -- until_block_ends
                local expires_at_22 = expires_at
                if KEEP_BLOCK and KEEP_BLOCK > expires_at_22 then
                  expires_at = KEEP_BLOCK break
                end
                expires_at = expires_at_22 break
              until true
            end
            local ms
            repeat -- ttl_ms
              local ms_23
              do -- cdiv
                local a, b = expires_at - now, 1000
                ms_23 = (a + (-a) % b) / b
              end
              ms_23 = ms_23 + TTL_SLACK
              if ms_23 < 1 then
                ms = 1 break
              end
              ms = ms_23 break
            until true
            call('SET', key, value, 'PX', format(INT, ms))
          until true
        until true
        return REPLY
      end
    end
    -- Not charged: a key that lost its TTL gets one (as `apply` does).
    if call('PTTL', key) == -1 then
      local ms
      repeat -- ttl_ms
        local expires_at = now + reset
        local ms_25
        do -- cdiv
          local a, b = expires_at - now, 1000
          ms_25 = (a + (-a) % b) / b
        end
        ms_25 = ms_25 + TTL_SLACK
        if ms_25 < 1 then
          ms = 1 break
        end
        ms = ms_25 break
      until true
      call('PEXPIRE', key, ms)
    end
    return REPLY
  end
  
  -- Phase one of several policies enforced (`decide_fused` in decide.lua), for the one at
  -- position i whose reply follows REPLY[base]: its verdict, remaining and reset in the
  -- reply; returns whether it admits and the state decided on.
  local function judged(key, p, now, cost, i, base)
    local st, ends, stale
    repeat -- read2
      local into = STATES[i]
      local raw = call('GET', key)
      if not raw then
        st, ends, stale = nil break
      end
      local a, b, tag, ends_27
      local t = p.tag
      if find(raw, t, #raw - #t + 1, true) then
        a, b = match(raw, '^(%d+) (%d+)~')
      end
      if not a then
        local state
        state, tag, ends_27 = split_state(raw)
        if tag == p.tag then
          tag = nil
        end
        a, b = match(state or '', '^(%d+) (%d+)$')
        if not a then
          st, ends, stale = nil, ends_27, tag break
        end
      end
      into[1], into[2] = tonumber(a), tonumber(b)
      st, ends, stale = into, ends_27, tag break
    until true
    if ends or stale then
      return nil
    end
    local ok, remaining, reset, retry
    repeat -- evaluate
      local capacity, unit, rate, full = p[1], p[2], p[3], p[4]
      local now_level
      repeat -- level
        if not st then
          now_level = 0 break
        end
        local elapsed = now - st[2]
        if elapsed < 0 then
          elapsed = 0
        end
        local to_empty
        do -- cdiv
          local a, b = st[1], p[3]
          to_empty = (a + (-a) % b) / b
        end
        if elapsed >= to_empty then
          now_level = 0 break
        end
        now_level = st[1] - elapsed * p[3] break
      until true
      local room = full - now_level
      if room < 0 then
        room = 0
      end
      local after = now_level + cost * unit
      if cost <= capacity and after <= full then
        local left
        do -- fdiv
          local a, b = full - after, unit
          left = (a - a % b) / b
        end
        local reset_28
        do -- cdiv
          local a, b = after, rate
          reset_28 = (a + (-a) % b) / b
        end
        ok, remaining, reset, retry = 1, left, reset_28, -1 break
      end
      local left
      do -- fdiv
        local a, b = room, unit
        left = (a - a % b) / b
      end
      local reset_28
      do -- cdiv
        local a, b = now_level, rate
        reset_28 = (a + (-a) % b) / b
      end
      if cost > capacity then
        ok, remaining, reset, retry = 0, left, reset_28, -1 break
      end
      local retry_28
      do -- cdiv
        local a, b = after - full, rate
        retry_28 = (a + (-a) % b) / b
      end
      ok, remaining, reset, retry = 0, left, reset_28, retry_28 break
    until true
    local behind
    do -- bucket_lag
      local last
      repeat -- last_after
        if st and st[2] > now then
          last = st[2] break
        end
        last = now break
      until true
      behind = last - now
    end
    if behind > 0 then
      do -- shift
        local lag, ok_38, remaining_38, reset_38, retry_38 = behind, ok, remaining, reset, retry
        if lag > 0 then
          remaining_38 = 0
          reset_38 = reset_38 + lag
          if retry_38 >= 0 then
            retry_38 = retry_38 + lag
          end
          if ok_38 == 1 and cost > 0 then
            ok_38, retry_38 = 0, lag
            if reset_38 < lag then
              reset_38 = lag
            end
          end
        end
        ok, remaining, reset, retry = ok_38, remaining_38, reset_38, retry_38
      end
    end
    REPLY[base + 2], REPLY[base + 3] = remaining, reset
    if ok == 1 then
      REPLY[base + 1] = -2
      return true, st
    end
    if retry < 0 then
      REPLY[base + 1] = -1
    else
      REPLY[base + 1] = retry
    end
    return false, st
  end
  
  return {
    fused = fused,
    judged = judged,
    block = block_in_value,
    load = load,
    level = level,
    lag = lag,
    evaluate = evaluate,
    -- A level no lower than what drains until the lease's end.
    lease_state = function(self, p, st, now, lease_end, into)
      local level = self.level(p, st, now)
      local full, rate, d = p[4], p[3], lease_end - now
      local drain = full
      if d < cdiv(full, rate) then
        drain = d * rate
      end
      if level < drain then
        level = drain
      end
      into[1], into[2] = level, last_after(st, now)
      return into
    end,
    -- Twin of `LeakyBucket::convert`: the level now (and the drain owed, ahead of now)
    -- re-counted in the new unit.
    convert = function(self, key, q, p, st, now)
      local level
      if st[2] > now then
        level = st[1] + (st[2] - now) * q[3]
      else
        level = self.level(q, st, now)
      end
      if level == 0 then
        return false
      end
      level = rescale(level, q[2], p[2])
      store(key, p, format(INT2, level, now), now, now + cdiv(level, p[3]))
      return true
    end,
    release = bucket_release,
    refund = function(self, key, p, st, now, units)
      if not st then
        return
      end
      local level = self.level(p, st, now)
      if units >= p[1] then
        level = 0
      else
        level = level - units * p[2]
        if level < 0 then
          level = 0
        end
      end
      local last = last_after(st, now)
      store(key, p, format(INT2, level, last), now, last + cdiv(level, p[3]))
    end,
    commit = commit,
  }
end
-- GCRA: twin of gcra.rs. Params: interval, tolerance (burst · interval, so a cost above the
-- burst is one whose cost · interval exceeds it). State: "tat" (a number, not a table).
-- Built when a decision first uses it (`algorithm` in decide.lua).
ALG[6] = function()
  --@inline
  local load = read1

  --@inline
  local function evaluate(self, p, st, now, cost)
    local interval, tolerance = p[1], p[2]
    local tat = now
    if st and st > now then
      tat = st
    end
    local backlog = tat - now
    local new_backlog = backlog + cost * interval
    if new_backlog <= tolerance then
      local left = fdiv(tolerance - new_backlog, interval)
      return 1, left, new_backlog, -1
    end
    local capped = backlog
    if capped > tolerance then
      capped = tolerance
    end
    local remaining_now = fdiv(tolerance - capped, interval)
    if cost * interval > tolerance then
      return 0, remaining_now, backlog, -1
    end
    return 0, remaining_now, backlog, new_backlog - tolerance
  end

  --@inline
  local function commit(self, key, p, st, now, cost)
    local tat = now
    if st and st > now then
      tat = st
    end
    tat = tat + cost * p[1]
    store(key, p, format(INT, tat), now, tat)
  end

  -- The fused decisions of policies enforced (`FUSES[op]`), the usual request: the phases of
  -- `decide` for that case, in functions per algorithm. The generator (luagen/) writes them
  -- into each twin, with the twin's own `load`, `evaluate`, `commit` and `lag` written in place
  -- of their calls. A key blocked, or written under other parameters, is left to the general
  -- path: nil, having written nothing.
  
  -- One policy alone. `args` are the policy's arguments, `shape` their first.
  local function fused(key, args, shape)
    local cost, at = 1, 2
    if shape % 2048 >= 1024 then
      cost = tonumber(args[2])
      at = 3
    end
    local p
    do -- read_params
      local tag = args[at]
      local p_1 = TAGGED[tag or '']
      if not p_1 and tag then
        local semi = find(tag, ';', 1, true)
        p_1 = { tag = semi and sub(tag, 1, semi - 1) or tag }
        if not tag_params(tag, p_1) then
          p_1 = nil
        else
          remember(tag, p_1)
        end
      end
      p = p_1
    end
    if not p then
      return nil
    end
    local now
    repeat -- clock
      local injected = shape >= 2048
      if injected then
        TTL_SLACK = tonumber(args[#args])
        now = tonumber(args[#args - 1]) break
      end
      TTL_SLACK = 0
      local t = call('TIME')
      now = t[1] * 1000000 + t[2] break
    until true
    local st, ends, stale
    repeat -- read1
      local raw = call('GET', key)
      if not raw then
        st, ends, stale = nil break
      end
      local bare
      repeat -- untagged
        local tag = p.tag
        if find(raw, tag, #raw - #tag + 1, true) then
          bare = sub(raw, 1, #raw - #tag) break
        end
        bare = nil break
      until true
      if bare then
        local n = tonumber(bare)
        if n then
          st, ends, stale = n break
        end
      end
      local state, tag, ends_3 = split_state(raw)
      if tag == p.tag then
        tag = nil
      end
      st, ends, stale = tonumber(state), ends_3, tag break
    until true
    if ends or stale then
      return nil
    end
    local ok, remaining, reset, retry
    repeat -- evaluate
      local interval, tolerance = p[1], p[2]
      local tat = now
      if st and st > now then
        tat = st
      end
      local backlog = tat - now
      local new_backlog = backlog + cost * interval
      if new_backlog <= tolerance then
        local left
        do -- fdiv
          local a, b = tolerance - new_backlog, interval
          left = (a - a % b) / b
        end
        ok, remaining, reset, retry = 1, left, new_backlog, -1 break
      end
      local capped = backlog
      if capped > tolerance then
        capped = tolerance
      end
      local remaining_now
      do -- fdiv
        local a, b = tolerance - capped, interval
        remaining_now = (a - a % b) / b
      end
      if cost * interval > tolerance then
        ok, remaining, reset, retry = 0, remaining_now, backlog, -1 break
      end
      ok, remaining, reset, retry = 0, remaining_now, backlog, new_backlog - tolerance break
    until true
    REPLY[2], REPLY[3], REPLY[3 + 1] = remaining, reset, nil
    if ok ~= 1 then
      if retry < 0 then
        REPLY[1] = -1
      else
        REPLY[1] = retry
      end
    else
      REPLY[1] = -2
      if cost > 0 then
        repeat -- commit
          local tat = now
          if st and st > now then
            tat = st
          end
          tat = tat + cost * p[1]
          repeat -- store
            local value, expires_at = format(INT, tat), tat
            value = value .. p.tag
            if p.limit_end and p.limit_end > expires_at then
              expires_at = p.limit_end
            end
            if KEEP_BLOCK then
              local block_end
              do -- int
                local n = KEEP_BLOCK
                block_end = format(INT, n)
              end
              value = value .. '|' .. block_end
              repeat -- until_block_ends
                local expires_at_11 = expires_at
                if KEEP_BLOCK and KEEP_BLOCK > expires_at_11 then
                  expires_at = KEEP_BLOCK break
                end
                expires_at = expires_at_11 break
              until true
            end
            local ms
            repeat -- ttl_ms
              local ms_12
              do -- cdiv
                local a, b = expires_at - now, 1000
                ms_12 = (a + (-a) % b) / b
              end
              ms_12 = ms_12 + TTL_SLACK
              if ms_12 < 1 then
                ms = 1 break
              end
              ms = ms_12 break
            until true
            call('SET', key, value, 'PX', format(INT, ms))
          until true
        until true
        return REPLY
      end
    end
    -- Not charged: a key that lost its TTL gets one (as `apply` does).
    if call('PTTL', key) == -1 then
      local ms
      repeat -- ttl_ms
        local expires_at = now + reset
        local ms_14
        do -- cdiv
          local a, b = expires_at - now, 1000
          ms_14 = (a + (-a) % b) / b
        end
        ms_14 = ms_14 + TTL_SLACK
        if ms_14 < 1 then
          ms = 1 break
        end
        ms = ms_14 break
      until true
      call('PEXPIRE', key, ms)
    end
    return REPLY
  end
  
  -- Phase one of several policies enforced (`decide_fused` in decide.lua), for the one at
  -- position i whose reply follows REPLY[base]: its verdict, remaining and reset in the
  -- reply; returns whether it admits and the state decided on.
  local function judged(key, p, now, cost, i, base)
    local st, ends, stale
    repeat -- read1
      local raw = call('GET', key)
      if not raw then
        st, ends, stale = nil break
      end
      local bare
      repeat -- untagged
        local tag = p.tag
        if find(raw, tag, #raw - #tag + 1, true) then
          bare = sub(raw, 1, #raw - #tag) break
        end
        bare = nil break
      until true
      if bare then
        local n = tonumber(bare)
        if n then
          st, ends, stale = n break
        end
      end
      local state, tag, ends_16 = split_state(raw)
      if tag == p.tag then
        tag = nil
      end
      st, ends, stale = tonumber(state), ends_16, tag break
    until true
    if ends or stale then
      return nil
    end
    local ok, remaining, reset, retry
    repeat -- evaluate
      local interval, tolerance = p[1], p[2]
      local tat = now
      if st and st > now then
        tat = st
      end
      local backlog = tat - now
      local new_backlog = backlog + cost * interval
      if new_backlog <= tolerance then
        local left
        do -- fdiv
          local a, b = tolerance - new_backlog, interval
          left = (a - a % b) / b
        end
        ok, remaining, reset, retry = 1, left, new_backlog, -1 break
      end
      local capped = backlog
      if capped > tolerance then
        capped = tolerance
      end
      local remaining_now
      do -- fdiv
        local a, b = tolerance - capped, interval
        remaining_now = (a - a % b) / b
      end
      if cost * interval > tolerance then
        ok, remaining, reset, retry = 0, remaining_now, backlog, -1 break
      end
      ok, remaining, reset, retry = 0, remaining_now, backlog, new_backlog - tolerance break
    until true
    REPLY[base + 2], REPLY[base + 3] = remaining, reset
    if ok == 1 then
      REPLY[base + 1] = -2
      return true, st
    end
    if retry < 0 then
      REPLY[base + 1] = -1
    else
      REPLY[base + 1] = retry
    end
    return false, st
  end
  
  return {
    fused = fused,
    judged = judged,
    block = block_in_value,
    load = load,
    evaluate = evaluate,
    -- The TAT no earlier than the lease's end: the units are charged as if spent then.
    lease_state = function(self, p, st, now, lease_end)
      local tat = now
      if st and st > now then
        tat = st
      end
      if lease_end > tat then
        tat = lease_end
      end
      return tat
    end,
    -- Twin of `Gcra::convert`: the backlog re-counted in the new interval.
    convert = function(self, key, q, p, st, now)
      if not st or st <= now then
        return false
      end
      local tat = now + rescale(st - now, q[1], p[1])
      store(key, p, format(INT, tat), now, tat)
      return true
    end,
    -- Gives back the latest slot only: its charge put the TAT at `slot + tolerance`.
    release = function(self, key, p, st, now, slot, units)
      if st and st == slot + p[2] then
        self:refund(key, p, st, now, units)
      end
    end,
    refund = function(self, key, p, st, now, units)
      if not st then
        return
      end
      local tat = st
      if tat < now then
        tat = now
      end
      tat = tat - units * p[1]
      if tat < now then
        tat = now
      end
      store(key, p, format(INT, tat), now, tat)
    end,
    commit = commit,
  }
end
-- What acts on a key's state on its own, before a decision judges it: the operations' `ACT`
-- arms (`act`), and the conversion of a state written under other parameters (`adopt`: a
-- reload, another instance's version, a key's own limit begun or ended). Written into the
-- script before `decide.lua`, which calls `act` and `adopt`.

-- Old parameters read from a tag, reused from call to call.
local OLD = {}

-- Puts the key's state `st`, written under `from` (nil: under nothing this policy reads),
-- under `to`: a key's own limit's parameters or the policy's, converted as a reload converts
-- it (twin of `Row::put_under` in Rust). With nothing used, only the key's own limit is kept
-- (and the block on record). The sliding log, whose entries mean the same under any quota,
-- marks its own limit itself.
local function put_under(alg, key, st, now, from, to)
  if alg.mark then
    alg:mark(key, to, now)
    return
  end
  if st and from and alg.convert and alg:convert(key, from, to, st, now) then
    return
  end
  local value, e = '', now
  if to.limit_end then
    value, e = to.tag, to.limit_end
  end
  if KEEP_BLOCK then
    value = value .. '|' .. int(KEEP_BLOCK)
    if KEEP_BLOCK > e then
      e = KEEP_BLOCK
    end
  end
  if value == '' then
    call('DEL', key)
  else
    call('SET', key, value, 'PX', format(INT, ttl_ms(now, e)))
  end
end

-- The parameters a state of tag `stale` was written under (nil: the present ones, `p`);
-- nil for a state of another algorithm.
local function written_under(stale, p)
  if not stale then
    return p
  end
  if find(stale, '@', 1, true) then
    return own_params(stale, p)
  end
  if tag_params(stale, OLD) == sub(p.tag, 1, 1) then
    return OLD
  end
  return nil
end

-- A state found written under other parameters (`stale`, its tag: the policy was reloaded, or
-- another instance runs another version of it), converted to the present ones and written
-- back (twin of `Compiled::convert`): the state and the block's end then. A state of another
-- algorithm, or one left with nothing used, is forgotten; the key keeps its block.
local function adopt(alg, key, p, st, ends, now, stale, into)
  if find(stale, '@', 1, true) then
    local o = own_params(stale, p)
    if o and o.limit_end > now and (not alg.keeps or alg.keeps(o, p)) then
      -- The key's own limit: decided under it.
      return st, ends, o
    end
    -- Its own limit has ended (or counts periods the policy no longer counts): back under
    -- the policy's quota, its usage kept.
    KEEP_BLOCK = ends
    put_under(alg, key, o and st, now, o, p)
    KEEP_BLOCK = nil
    local kept, block = alg.load(key, p, now, into)
    return kept, block, p
  end
  if st and alg.convert and tag_params(stale, OLD) == sub(p.tag, 1, 1) then
    KEEP_BLOCK = ends
    local kept = alg:convert(key, OLD, p, st, now)
    KEEP_BLOCK = nil
    if kept then
      local state, block = alg.load(key, p, now, into)
      return state, block, p
    end
  end
  if ends then
    call('SET', key, '|' .. int(ends), 'KEEPTTL')
  else
    call('DEL', key)
  end
  return nil, ends, p
end


-- The arms of the operations that act on their own (twin of `act` in the memory store), each
-- called with the policy's algorithm, key, parameters, state, the time, the units and the
-- operation's integer; the block on record is kept by every write they make.
local ACT = {}
ACT[7] = function(alg, key, p, st, now, units)
  alg:refund(key, p, st, now, units)
end
ACT[8] = function(_, key)
  call('DEL', key)
end
ACT[9] = function(alg, key, p, st, now, units)
  if units > 0 then
    alg:commit(key, p, st, now, units)
  end
end
ACT[10] = function(alg, key, p, st, now, _, us)
  alg:block(key, p, st, now, now + us)
end
-- The algorithm's own give-back, else a refund until the lease's end: see `Step::give_back`.
ACT[11] = function(alg, key, p, st, now, units, lease_end)
  if alg.give_back then
    alg:give_back(key, p, st, now, lease_end, units)
  elseif now <= lease_end then
    alg:refund(key, p, st, now, units)
  end
end
-- The algorithm's own release, else its give-back: see `Step::release`.
ACT[12] = function(alg, key, p, st, now, units, at)
  if alg.release then
    alg:release(key, p, st, now, at, units)
  elseif alg.give_back then
    alg:give_back(key, p, st, now, at, units)
  end
end

-- The difference between a request's real cost and its estimate, given back or owed (the
-- algorithm's own debit, else a charge: see `Step::debit`).
ACT[13] = function(alg, key, p, st, now, units, estimate)
  if units < estimate then
    alg:refund(key, p, st, now, estimate - units)
  elseif units > estimate then
    local debit = alg.debit or alg.commit
    debit(alg, key, p, st, now, units - estimate)
  end
end

-- A key's own limit, `p` (its parameters, then '@' and its quota), until `limit_end` (0: the
-- longest window's time from now): the state converted from what it was written under.
ACT[14] = function(alg, key, p, st, now, from, limit_end)
  if limit_end == 0 then
    limit_end = now + 31622400000000
  end
  local at = find(p.tag, '@', 1, true)
  local tag = sub(p.tag, 1, at) .. int(limit_end) .. 'E0,' .. sub(p.tag, at + 1)
  put_under(alg, key, st, now, from, own_params(tag, p))
end
-- Back under the policy's own quota (`p`), from a key's own limit.
ACT[15] = function(alg, key, p, st, now, from)
  if from ~= p then
    put_under(alg, key, st, now, from, p)
  end
end

-- Runs the act of `op` on the key (its state loaded in `into`, converted first when it was
-- written under other parameters, or decided under the key's own limit); a key's own limit
-- set or ended is given what the state was written under instead of the units.
local function act(alg, op, key, p, now, units, x, into)
  local st, ends, stale = alg.load(key, p, now, into)
  if RELIMITS[op] then
    KEEP_BLOCK = ends
    ACT[op](alg, key, p, st, now, written_under(stale, p), x)
    KEEP_BLOCK = nil
    return
  end
  if stale then
    st, ends, p = adopt(alg, key, p, st, ends, now, stale, into)
  end
  KEEP_BLOCK = ends
  ACT[op](alg, key, p, st, now, units, x)
  KEEP_BLOCK = nil
end
-- Decides one request against one or more policies, atomically.
-- KEYS[i]: the state key of policy i (all in one hash slot).
-- ARGV: for each policy, its shape, then its cost when the shape says one follows, then the
-- ARGS[op] integers of its operation, then its tag (its algorithm and parameters: see
-- `read_params` and `store`); after the last
-- policy, when the first shape says the time is injected, the time in microseconds and the
-- milliseconds added to every TTL (Redis expires keys on its own clock, which an injected
-- clock may outrun or lag). Otherwise the time is Redis TIME.
-- A shape is one integer: algorithm + MODE_UNIT * operation, plus COST_FLAG when a cost other
-- than 1 follows and CLOCK_FLAG when the time is injected.
-- The algorithm ids, the operations and each operation's facts are generated from Rust
-- (`Algorithm`, and `Op` in `store/op.rs`, which says what each operation is): the tables
-- DECIDES (a denial denies the request), CHARGES (0: never charged here; 1: when its own
-- verdict admits; 2: always, if the request is admitted), ACTS (changes the state on its own,
-- then looks at cost 0: its arm is ACT[op] in act.lua), ARGS (its integers), GRANTS (its reply
-- has the three integers of a grant) and FUSES (decided by its algorithm's fused decisions,
-- alone or beside others of the same: `fused.lua`, written into each twin by luagen/).
-- The operations' own arms are here and in act.lua, nowhere else: ACT[op] for those that act;
-- LEASE (decided on the state as strict as a lease could make it, `lease_state`, and charged
-- a lease of what is left instead of its cost, `take_lease`), WAIT (a request it denies now
-- is admitted when a wait of at most its integer would admit it, `reservation` and
-- `reserve`), CONCURRENCY (its grant is the slots charged and the time they were charged at).
-- A blocked key is denied whatever its state, until the block ends; the block is kept in the
-- state key itself (see `read` and the sliding log), so a decision finds it with the read it
-- makes anyway, and stays on record while the key lives (a clock that goes back finds it
-- again, as the memory store does).
-- Every operation that acts does so first, in order; then each policy is evaluated; then
-- charged only if all that decide admit.
-- Reply: CHECK_WIDTH integers per policy, each at its place (`at` in script.rs, AT_... here):
-- the verdict (ADMITTED, or the retry-after in microseconds, or NEVER when no wait admits it),
-- remaining, reset_after_us; remaining and reset describe the state after this request's
-- charges. A granting operation's reply has REPLY_GRANT more: the units granted (0 when none),
-- the grant's end (a lease's end, a reserved time, the time held slots were charged at), and
-- the microseconds until then.

-- Each algorithm's functions, built the first time a decision uses it: once per call when
-- this runs as a script (which runs whole on every call), once per load as a function.
local BUILT = {}
local function algorithm(id)
  local alg = BUILT[id]
  if not alg then
    local make = ALG[id]
    if not make then
      return nil
    end
    alg = make()
    BUILT[id] = alg
  end
  return alg
end

-- The policy whose shape is at args[at], the i-th of the call: its algorithm, operation,
-- parameters (`read_params`), cost and the operation's integers; where the next policy starts
-- and whether the time is injected. Nil when malformed.
local function read_policy(args, at, i)
  local shape = SHAPES[args[at]] or read_shape(args[at])
  if not shape then
    return nil
  end
  local id = shape % 32
  local alg = BUILT[id] or algorithm(id)
  local op = (shape % 1024 - id) / 32
  if not alg or not ARGS[op] then
    return nil
  end
  local cost = 1
  at = at + 1
  if shape % 2048 >= 1024 then
    cost = tonumber(args[at])
    at = at + 1
  end
  local count, x, y = ARGS[op], nil, nil
  if count > 0 then
    x = tonumber(args[at])
    if count > 1 then
      y = tonumber(args[at + 1])
    end
    at = at + count
  end
  if not STATES[i] then
    STATES[i], LEASED[i] = {}, {}
  end
  local p = read_params(args[at])
  if not p then
    return nil
  end
  return alg, op, p, cost, x, y, at + 1, shape >= 2048
end

-- Phase one for a policy: its verdict as the reply gives it, remaining and reset.
local function judge(alg, p, st, ends, now, cost, key)
  local ok, remaining, reset, retry = alg:evaluate(p, st, now, cost, key)
  if alg.lag then
    ok, remaining, reset, retry = shift(alg.lag(p, st, now), cost, ok, remaining, reset, retry)
  end
  if ends and ends > now then
    -- Blocked: denied until the block ends, whatever the state (twin of `apply_block`).
    local wait = ends - now
    if ok == 1 or retry >= 0 then
      if retry < wait then
        retry = wait
      end
    end
    ok = 0
    remaining = 0
    if reset < wait then
      reset = wait
    end
  end
  if ok == 1 then
    return -2, remaining, reset
  end
  if retry < 0 then
    return -1, remaining, reset
  end
  return retry, remaining, reset
end

-- For a WAIT policy denied now with `verdict`: the wait until the time that admits it, when
-- it is a retry-after of at most `max_wait`, the cost is not 0 (a look reserves nothing) and
-- the key is not blocked (twin of
-- `reservation` in Rust); else nil.
local function reservation(alg, p, st, ends, now, cost, key, verdict, max_wait)
  if cost == 0 or verdict < 0 or verdict > max_wait or (ends and ends > now) then
    return nil
  end
  if judge(alg, p, st, ends, now + verdict, cost, key) == -2 then
    return verdict
  end
  return nil
end

-- Phase two for a WAIT policy admitted at the time `wait` microseconds away: charges it
-- there (the key's TTL still counted from now), then reports the state as it is seen now,
-- with the units, the time and the wait after the verdict. `scratch` is a table to load the
-- new state in.
local function reserve(alg, key, p, st, ends, now, cost, wait, reply, at, scratch)
  local at_time = now + wait
  KEEP_BLOCK = ends
  if alg.reserve_commit then
    alg:reserve_commit(key, p, st, now, at_time, cost)
  else
    local slack = TTL_SLACK
    TTL_SLACK = slack + cdiv(wait, 1000)
    alg:commit(key, p, st, at_time, cost)
    TTL_SLACK = slack
  end
  KEEP_BLOCK = nil
  -- Admitted, the state reported as it is seen now (a look may deny: the sliding log still
  -- counts, now, entries that are gone at that time).
  local seen = alg.load(key, p, now, scratch)
  local _, remaining, reset = judge(alg, p, seen, nil, now, 0, key)
  reply[at + 1], reply[at + 2] = -2, remaining
  reply[at + 3] = reset
  reply[at + 4], reply[at + 5], reply[at + 6] = cost, at_time, wait
end

-- Phase two for an admitted LEASE of up to `want` units ending at `lease_end`: leases
-- what is left, at least the cost and at most the units wanted, and reports the verdict with
-- the lease counted as spent (twin of `take_lease` in Rust).
local function take_lease(alg, key, p, st, ends, now, cost, want, lease_end, reply, at)
  local _, left = alg:evaluate(p, st, now, 0, key)
  local units = left
  if units > want then
    units = want
  end
  if units < cost then
    units = cost
  end
  local verdict, remaining, reset = judge(alg, p, st, ends, now, units, key)
  if verdict ~= -2 and units > cost then
    units = cost
    verdict, remaining, reset = judge(alg, p, st, ends, now, units, key)
  end
  if units > 0 then
    KEEP_BLOCK = ends
    if alg.lease_commit then
      alg:lease_commit(key, p, st, now, lease_end, units)
    else
      alg:commit(key, p, st, now, units)
    end
    KEEP_BLOCK = nil
  end
  reply[at + 1], reply[at + 2], reply[at + 3] = verdict, remaining, reset
  reply[at + 4], reply[at + 5], reply[at + 6] = units, lease_end, lease_end - now
end

-- What each policy of a decision hands from one phase to the next, reused from call to call.
local ALGS, OPS, PS, COSTS, XS, YS, STS, ENDS, LEASE_ENDS, WAITS = {}, {}, {}, {}, {}, {}, {}, {},
  {}, {}

-- Phase one for the policy at position i, whose reply follows REPLY[base]: its state,
-- loaded in STATES[i] (converted first when written under other parameters; as strict as a
-- lease could make it, in LEASED[i], for a LEASE whose longest life is `x`: twin of
-- `lease_verdict` in Rust), its verdict in the reply, and for a WAIT denied now, the wait of
-- at most `x` until the time that would admit it. Returns whether it admits the request, the
-- state and block decided on, the lease's end and the wait.
local function evaluate(i, alg, op, key, p, now, cost, x, base)
  local into = STATES[i]
  local st, ends, stale = alg.load(key, p, now, into)
  if stale then
    st, ends, p = adopt(alg, key, p, st, ends, now, stale, into)
    -- Phase two, and the reply, under the key's own limit if it has one.
    PS[i] = p
  end
  local lease_end
  if op == 6 then
    lease_end = now + x
    if alg.lease_end then
      lease_end = alg:lease_end(p, st, now, x)
    end
    if alg.lease_state then
      st = alg:lease_state(p, st, now, lease_end, LEASED[i])
    end
  end
  local verdict, remaining, reset = judge(alg, p, st, ends, now, cost, key)
  REPLY[base + 1], REPLY[base + 2], REPLY[base + 3] = verdict, remaining,
    reset
  if GRANTS[op] then
    REPLY[base + 4], REPLY[base + 5], REPLY[base + 6] = 0, 0, 0
  end
  if verdict == -2 then
    return true, st, ends, lease_end
  end
  if op == 5 then
    local wait = reservation(alg, p, st, ends, now, cost, key, verdict, x)
    return wait ~= nil, st, ends, lease_end, wait
  end
  return false, st, ends
end

-- Phase two for the policy at position i, the request `admitted` or not: charged as its
-- operation says (at its reserved time `wait` away, a lease of up to `y` units ending at
-- `lease_end`, its cost; keeping its block on record), or the state reported as it stays, its
-- key given a TTL if it lost its own.
local function apply(i, alg, op, key, p, now, cost, y, st, ends, lease_end, wait, admitted, base)
  if admitted then
    if wait then
      reserve(alg, key, p, st, ends, now, cost, wait, REPLY, base, LEASED[i])
      return
    end
    if op == 6 then
      take_lease(alg, key, p, st, ends, now, cost, y, lease_end, REPLY, base)
      return
    end
    local charges = CHARGES[op]
    if cost > 0 and (charges == 2 or (charges == 1 and REPLY[base + 1] == -2)) then
      KEEP_BLOCK = ends
      alg:commit(key, p, st, now, cost)
      KEEP_BLOCK = nil
      if op == 4 then
        REPLY[base + 4], REPLY[base + 5] = cost, now
      end
      return
    end
  end
  if REPLY[base + 1] == -2 and cost > 0 then
    -- Admitted by this policy but not charged: report the state as it stays.
    local ok, remaining, reset, retry = alg:evaluate(p, st, now, 0, key)
    if alg.lag then
      ok, remaining, reset = shift(alg.lag(p, st, now), 0, ok, remaining, reset, retry)
    end
    REPLY[base + 2] = remaining
    REPLY[base + 3] = reset
  end
  if call('PTTL', key) == -1 then
    -- A key without a TTL (written by something else, or lost its TTL): repair it.
    call('PEXPIRE', key, ttl_ms(now, now + REPLY[base + 3]))
  end
end

-- After the checks' replies (`total` integers), each key decided under its own limit: its
-- place and its quota's limit, window and burst (`OWN_WIDTH` integers; see `own_quota` in
-- Rust); then the reply's end.
local function own_limits(n, total)
  for i = 1, n do
    local o = PS[i]
    if o.limit_end then
      local q = o.quota
      REPLY[total + 1], REPLY[total + 2] = i, q[1]
      REPLY[total + 3], REPLY[total + 4] = q[2], q[3]
      total = total + 4
    end
  end
  REPLY[total + 1] = nil
end

local function malformed(args, at)
  return redis.error_reply('tower-ratelimit: malformed policy ' .. tostring(args[at]))
end

-- Several policies: each read (all before anything is done: a malformed call changes
-- nothing); every act, in order; phase one for each, what phase two needs kept in tables;
-- then phase two for each.
local function decide_many(keys, args, n)
  local at, injected = 1, false
  for i = 1, n do
    local alg, op, p, cost, x, y, next_at, clock_flag = read_policy(args, at, i)
    if not alg then
      return malformed(args, at)
    end
    ALGS[i], OPS[i], PS[i], COSTS[i], XS[i], YS[i], at = alg, op, p, cost, x, y, next_at
    injected = injected or (i == 1 and clock_flag)
  end
  local now = clock(args, injected)
  for i = 1, n do
    if ACTS[OPS[i]] then
      act(ALGS[i], OPS[i], keys[i], PS[i], now, COSTS[i], XS[i], STATES[i])
      COSTS[i] = 0
    end
  end
  local admitted, base = true, 0
  for i = 1, n do
    local op = OPS[i]
    local ok, st, ends, lease_end, wait = evaluate(i, ALGS[i], op, keys[i], PS[i], now,
      COSTS[i], XS[i], base)
    if not ok and DECIDES[op] then
      admitted = false
    end
    STS[i], ENDS[i], LEASE_ENDS[i], WAITS[i] = st, ends, lease_end, wait
    base = base + WIDTH[op]
  end
  REPLY[base + 1] = nil
  local total = base
  base = 0
  for i = 1, n do
    local op = OPS[i]
    apply(i, ALGS[i], op, keys[i], PS[i], now, COSTS[i], YS[i], STS[i], ENDS[i],
      LEASE_ENDS[i], WAITS[i], admitted, base)
    base = base + WIDTH[op]
  end
  own_limits(n, total)
  return REPLY
end

-- The algorithm of each shape that is decided by its algorithm's fused decisions, false for
-- a shape that is not (`fused_for`).
local FUSED = {}

-- The algorithm of a policy of this shape, remembered, when its operation is one the fused
-- decisions decide (`FUSES`), else false.
local function fused_for(shape)
  local id = shape % 32
  local fused = false
  if FUSES[(shape % 1024 - id) / 32] then
    fused = algorithm(id) or false
  end
  FUSED[shape] = fused
  return fused
end

-- Several policies, each enforced (the usual request of several): every one read, the time
-- read, each judged by its algorithm's fused phase one (`judged`), then either each charged
-- by its algorithm's `commit` (all admit) or each left as `apply` leaves a denied request's.
-- Nil, having written nothing, when one is another operation, a cost of 0, a key blocked or written
-- under other parameters, or malformed: the general path decides it.
local function decide_fused(keys, args, n)
  local at, injected = 1, false
  for i = 1, n do
    local shape = SHAPES[args[at]] or read_shape(args[at])
    if not shape then
      return nil
    end
    local alg = FUSED[shape]
    if alg == nil then
      alg = fused_for(shape)
    end
    if not alg then
      return nil
    end
    local cost = 1
    at = at + 1
    if shape % 2048 >= 1024 then
      cost = tonumber(args[at])
      if not cost or cost <= 0 then
        return nil
      end
      at = at + 1
    end
    local p = read_params(args[at])
    if not p then
      return nil
    end
    at = at + 1
    if i == 1 then
      injected = shape >= 2048
    end
    if not STATES[i] then
      STATES[i], LEASED[i] = {}, {}
    end
    ALGS[i], PS[i], COSTS[i] = alg, p, cost
  end
  local now = clock(args, injected)
  local admitted, base = true, 0
  for i = 1, n do
    local ok, st = ALGS[i].judged(keys[i], PS[i], now, COSTS[i], i, base)
    if ok == nil then
      return nil
    end
    admitted = admitted and ok
    STS[i] = st
    base = base + 3
  end
  REPLY[base + 1] = nil
  for i = 1, n do
    if admitted then
      ALGS[i]:commit(keys[i], PS[i], STS[i], now, COSTS[i])
    else
      apply(i, ALGS[i], 1, keys[i], PS[i], now, COSTS[i], nil, STS[i], nil, nil, nil, false,
        3 * (i - 1))
    end
  end
  return REPLY
end

local function decide(keys, args)
  if not format then
    bind_libraries()
  end
  KEEP_BLOCK = nil
  local n = #keys
  if n ~= 1 then
    return decide_fused(keys, args, n) or decide_many(keys, args, n)
  end
  local key = keys[1]
  -- One policy enforced alone, the usual request: the algorithm's fused decision, unless the
  -- key is blocked or was written under other parameters.
  local shape = SHAPES[args[1]] or read_shape(args[1])
  if shape then
    local fused = FUSED[shape]
    if fused == nil then
      fused = fused_for(shape)
    end
    if fused then
      local reply = fused.fused(key, args, shape)
      if reply then
        return reply
      end
    end
  end
  -- Any other policy alone: the same phases as several, what they hand on kept in locals.
  local alg, op, p, cost, x, y, _, injected = read_policy(args, 1, 1)
  if not alg then
    return malformed(args, 1)
  end
  local now = clock(args, injected)
  if ACTS[op] then
    act(alg, op, key, p, now, cost, x, STATES[1])
    cost = 0
  end
  PS[1] = p
  local ok, st, ends, lease_end, wait = evaluate(1, alg, op, key, p, now, cost, x, 0)
  REPLY[WIDTH[op] + 1] = nil
  apply(1, alg, op, key, PS[1], now, cost, y, st, ends, lease_end, wait, ok or not DECIDES[op], 0)
  own_limits(1, WIDTH[op])
  return REPLY
end
