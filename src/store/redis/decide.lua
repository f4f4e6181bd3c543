-- Decides one request against one or more policies, atomically.
-- KEYS[i]: the state key of policy i (all in one slot).
-- ARGV: for each policy, its shape, then its cost when the shape says one follows, then its
-- parameters; after the last policy, when the first shape says the time is injected, the
-- time in microseconds and the milliseconds added to every TTL (Redis expires keys on its
-- own clock, which an injected clock may outrun or lag). Otherwise the time is Redis TIME.
-- A shape is one integer: algorithm + MODE_UNIT * mode + ARITY_UNIT * parameter count,
-- plus COST_FLAG when a cost other than 1 follows and CLOCK_FLAG when the time is injected.
-- After the cost, a LEASE policy has two more integers (the lease's longest life in
-- microseconds, the units wanted) and a GIVE_BACK policy one (the end of the lease whose
-- units it gives back); then come the parameters.
-- The algorithm ids and the modes are the constants of the generated prelude (from
-- `Algorithm` and `Mode` in Rust):
-- ENFORCE decides, and is charged only if every policy that decides admits the request;
-- SHADOW is reported, never decides, and is charged if it admits and the request goes on;
-- CHARGE_LATER decides and is never charged here (the charge comes after the response);
-- REFUND gives `cost` units back, RESET forgets the key and any block, PENALIZE charges `cost`
-- units whatever the state, BLOCK denies the key for the next `cost` microseconds; each of
-- these four then looks at cost 0.
-- LEASE decides like ENFORCE, on the state as strict as a lease could make it (`lease_state`);
-- when the request is admitted it is charged a lease instead of its cost: what is left, at
-- least the cost and at most the units wanted, counted as the algorithm counts a lease ending
-- at its end (`lease_commit`). GIVE_BACK gives `cost` units of the lease that ended at the
-- given time back (`give_back`, else a refund), then looks at cost 0.
-- HOLD decides and charges like ENFORCE; its reply has the three integers of a LEASE: the
-- units charged (0 when none), the time they were charged at (to be given back with RELEASE
-- of that time when the request ends), and 0.
-- RELEASE gives back `cost` units reserved at the given slot (`release`, else `give_back`),
-- then looks at cost 0.
-- RESERVE decides like ENFORCE; a request it denies now is admitted instead when it would be
-- admitted after a wait of at most the given microseconds (its retry-after), and is then
-- charged at that slot (`reserve_commit`, else a charge made at the slot). Its reply has the
-- three integers of a LEASE: the units reserved (0 when it did not wait), the slot, and the
-- microseconds until then.
-- A blocked key is denied whatever its state, until the block ends; the block is kept in the
-- state key itself (see `read` and the sliding log), so a decision finds it with the read it
-- makes anyway, and stays on record while the key lives (a clock that goes back finds it
-- again, as the memory store does).
-- Each policy is evaluated, then charged only if all that decide admit.
-- Reply: REPLY_PER_POLICY integers per policy: the verdict (ADMITTED, or the retry-after in
-- microseconds, or NEVER when no wait admits it), remaining, reset_after_us; remaining and
-- reset describe the state after this request's charges. A LEASE policy's reply has three
-- more: the units leased (0 when none), the lease's end, and the microseconds until then.

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

-- Tables reused from call to call (a table costs Redis about 1,100 instructions to build and
-- collect): the parameters, the state and the lease state of the policy at each position, and
-- the replies of a one-policy decision. A call runs alone, and Redis has read the reply before
-- the next one.
local PARAMS, STATES, LEASED, REPLY1, REPLY1_LEASE = {}, {}, {}, { 0, 0, 0 }, { 0, 0, 0, 0, 0, 0 }

-- The policy whose shape is at args[at], the i-th of the call: its algorithm, mode, parameters
-- (in PARAMS[i]) and cost, where the next policy starts, whether the time is injected, and
-- the mode's own integers (LEASE: the lease's longest life in microseconds and the units
-- wanted; GIVE_BACK: the end of the lease whose units come back).
local function read_policy(args, at, i)
  local shape = tonumber(args[at])
  if not shape then
    return nil
  end
  local id = shape % MODE_UNIT
  local alg = BUILT[id] or algorithm(id)
  if not alg then
    return nil
  end
  local mode = (shape % ARITY_UNIT - id) / MODE_UNIT
  local arity = (shape % COST_FLAG - shape % ARITY_UNIT) / ARITY_UNIT
  local cost = 1
  at = at + 1
  if shape % CLOCK_FLAG >= COST_FLAG then
    cost = tonumber(args[at])
    at = at + 1
  end
  local x, y
  if mode == LEASE then
    x, y = tonumber(args[at]), tonumber(args[at + 1])
    at = at + 2
  elseif mode == GIVE_BACK or mode == RESERVE or mode == RELEASE then
    x = tonumber(args[at])
    at = at + 1
  end
  local p = PARAMS[i]
  if not p then
    p = {}
    PARAMS[i], STATES[i], LEASED[i] = p, {}, {}
  end
  for k = 1, arity do
    p[k] = tonumber(args[at + k - 1])
  end
  -- The tag a state written under these parameters carries (see `store`).
  p.tag = args[at + arity]
  return alg, mode, p, cost, at + arity + 1, shape >= CLOCK_FLAG, x, y
end

-- Old parameters read from a tag, reused from call to call.
local OLD = {}

-- A state found written under other parameters (`stale`, its tag: the policy was reloaded, or
-- another instance runs another version of it), converted to the present ones and written
-- back (twin of `Compiled::convert`): the state and the block's end then. A state of another
-- algorithm, or one left with nothing used, is forgotten; the key keeps its block.
local function adopt(alg, key, p, st, ends, now, stale, into)
  local id, rest = match(stale, '^~(%d+):(.*)$')
  if st and alg.convert and id and id == match(p.tag, '^~(%d+):') then
    local k = 0
    for word in string.gmatch(rest, '[^,]+') do
      k = k + 1
      OLD[k] = tonumber(word, 36)
    end
    KEEP_BLOCK = ends
    local kept = alg:convert(key, OLD, p, st, now)
    KEEP_BLOCK = nil
    if kept then
      return alg.load(key, p, now, into)
    end
  end
  if ends then
    call('SET', key, '|' .. int(ends), 'KEEPTTL')
  else
    call('DEL', key)
  end
  return nil, ends
end

-- The state of a policy's key, and its block's end if any, after the admin modes have acted
-- on it; the cost the decision then looks at; and for a LEASE, the lease's end, with the state
-- as strict as the lease could make it (twin of `lease_verdict` in Rust).
local function prepare(alg, key, p, now, cost, mode, into, x, leased)
  local st, ends, stale = alg.load(key, p, now, into)
  if stale then
    st, ends = adopt(alg, key, p, st, ends, now, stale, into)
  end
  if mode == ENFORCE or mode == SHADOW or mode == CHARGE_LATER or mode == RESERVE
    or mode == HOLD then
    return st, ends, cost
  end
  if mode == LEASE then
    local lease_end = now + x
    if alg.lease_end then
      lease_end = alg:lease_end(p, st, now, x)
    end
    if alg.lease_state then
      st = alg:lease_state(p, st, now, lease_end, leased)
    end
    return st, ends, cost, lease_end
  end
  if mode == RESET then
    call('DEL', key)
    return nil, nil, 0
  end
  if mode == BLOCK then
    ends = now + cost
    alg:block(key, p, st, now, ends)
    return st, ends, 0
  end
  KEEP_BLOCK = ends
  if mode == REFUND then
    alg:refund(key, p, st, now, cost)
  elseif mode == GIVE_BACK then
    -- The algorithm's own give-back, else a refund until the lease's end (`x`): see
    -- `Step::give_back` in Rust.
    if alg.give_back then
      alg:give_back(key, p, st, now, x, cost)
    elseif now <= x then
      alg:refund(key, p, st, now, cost)
    end
  elseif mode == RELEASE then
    -- The algorithm's own release, else its give-back (`Step::release` in Rust).
    if alg.release then
      alg:release(key, p, st, now, x, cost)
    elseif alg.give_back then
      alg:give_back(key, p, st, now, x, cost)
    end
  elseif mode == PENALIZE and cost > 0 then
    alg:commit(key, p, st, now, cost)
  end
  KEEP_BLOCK = nil
  st, ends = alg.load(key, p, now, into)
  return st, ends, 0
end
-- The clock-lag adjustment (twin of `evaluate_with_lag`), for the algorithms that keep their own
-- time (`alg.lag`): a state newer than `now` (the clock went back, or a request reserved a
-- later slot) decides as of its own time, its times moved to be from `now`, and admits no cost
-- before then. Called only for those algorithms, so the others pay nothing for it.
local function shift(alg, p, st, now, cost, ok, remaining, reset, retry)
  local lag = alg.lag(p, st, now)
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

-- Phase one for a policy: its verdict as the reply gives it, remaining and reset.
local function judge(alg, p, st, ends, now, cost, key)
  local ok, remaining, reset, retry = alg:evaluate(p, st, now, cost, key)
  if alg.lag then
    ok, remaining, reset, retry = shift(alg, p, st, now, cost, ok, remaining, reset, retry)
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
    return ADMITTED, remaining, reset
  end
  if retry < 0 then
    return NEVER, remaining, reset
  end
  return retry, remaining, reset
end

-- For a RESERVE policy denied now with `verdict`: the wait until the slot that admits it, when
-- it is a retry-after of at most `max_wait`, the cost is not 0 (a look reserves nothing) and
-- the key is not blocked (twin of
-- `reservation` in Rust); else nil.
local function reservation(alg, p, st, ends, now, cost, key, verdict, max_wait)
  if cost == 0 or verdict < 0 or verdict > max_wait or (ends and ends > now) then
    return nil
  end
  if judge(alg, p, st, ends, now + verdict, cost, key) == ADMITTED then
    return verdict
  end
  return nil
end

-- Phase two for a RESERVE policy admitted at the slot `wait` microseconds away: charges it
-- there (the key's TTL still counted from now), then reports the state as it is seen now,
-- with the units, the slot and the wait after the verdict. `scratch` is a table to load the
-- new state in.
local function reserve(alg, key, p, st, ends, now, cost, wait, reply, at, scratch)
  local slot = now + wait
  KEEP_BLOCK = ends
  if alg.reserve_commit then
    alg:reserve_commit(key, p, st, now, slot, cost)
  else
    local slack = TTL_SLACK
    TTL_SLACK = slack + cdiv(wait, 1000)
    alg:commit(key, p, st, slot, cost)
    TTL_SLACK = slack
  end
  KEEP_BLOCK = nil
  -- Admitted, the state reported as it is seen now (a look may deny: the sliding log still
  -- counts, now, entries that are gone at the slot).
  local seen = alg.load(key, p, now, scratch)
  local _, remaining, reset = judge(alg, p, seen, nil, now, 0, key)
  reply[at + 1], reply[at + 2], reply[at + 3] = ADMITTED, remaining, reset
  reply[at + 4], reply[at + 5], reply[at + 6] = cost, slot, wait
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
  if verdict ~= ADMITTED and units > cost then
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

-- Phase two for a policy whose reply starts at reply[at + 1]: charges it (keeping its block,
-- `ends`, on record), or reports the state as it stays and gives the key a TTL if it lost its
-- own.
local function settle(alg, key, p, st, ends, now, cost, charge, reply, at, want, lease_end)
  if want then
    -- A lease: its units, its end and the microseconds until then follow the verdict.
    reply[at + 4], reply[at + 5], reply[at + 6] = 0, 0, 0
    if charge then
      take_lease(alg, key, p, st, ends, now, cost, want, lease_end, reply, at)
      return
    end
  end
  if charge then
    KEEP_BLOCK = ends
    alg:commit(key, p, st, now, cost)
    KEEP_BLOCK = nil
    return
  end
  if reply[at + 1] == ADMITTED and cost > 0 then
    -- Admitted by this policy but not charged: report the state as it stays.
    local ok, remaining, reset, retry = alg:evaluate(p, st, now, 0, key)
    if alg.lag then
      ok, remaining, reset = shift(alg, p, st, now, 0, ok, remaining, reset, retry)
    end
    reply[at + 2] = remaining
    reply[at + 3] = reset
  end
  if call('PTTL', key) == -1 then
    -- A key without a TTL (written by something else, or lost its TTL): repair it.
    call('PEXPIRE', key, ttl_ms(now, now + reply[at + 3]))
  end
end

local function decide(keys, args)
  if not format then
    bind_libraries()
  end
  KEEP_BLOCK = nil
  local n = #keys
  local alg, mode, p, cost, at, injected, x, y = read_policy(args, 1, 1)
  if not alg then
    return redis.error_reply('tower-ratelimit: malformed policy ' .. tostring(args[1]))
  end
  local now
  if injected then
    now = tonumber(args[#args - 1])
    TTL_SLACK = tonumber(args[#args])
  else
    local t = call('TIME')
    now = t[1] * 1000000 + t[2]
    TTL_SLACK = 0
  end

  if n == 1 then
    -- One policy, the usual case: no tables beyond its parameters and the reply.
    local key = keys[1]
    local st, ends, lease_end
    st, ends, cost, lease_end = prepare(alg, key, p, now, cost, mode, STATES[1], x, LEASED[1])
    local verdict, remaining, reset = judge(alg, p, st, ends, now, cost, key)
    local reply, want = REPLY1, nil
    if mode == LEASE or mode == RESERVE or mode == HOLD then
      reply = REPLY1_LEASE
      reply[4], reply[5], reply[6] = 0, 0, 0
      if mode == LEASE then
        want = y
      end
    end
    reply[1], reply[2], reply[3] = verdict, remaining, reset
    local wait = mode == RESERVE and verdict ~= ADMITTED
      and reservation(alg, p, st, ends, now, cost, key, verdict, x)
    if wait then
      reserve(alg, key, p, st, ends, now, cost, wait, reply, 0, LEASED[1])
      return reply
    end
    local charge = verdict == ADMITTED and (mode == LEASE or (cost > 0
      and (mode == ENFORCE or mode == SHADOW or mode == RESERVE or mode == HOLD)))
    settle(alg, key, p, st, ends, now, cost, charge, reply, 0, want, lease_end)
    if charge and mode == HOLD then
      reply[4], reply[5] = cost, now
    end
    return reply
  end

  local algs, params, costs, modes, states, blocks = {}, {}, {}, {}, {}, {}
  local wants, lease_ends, bases, waits = {}, {}, {}, {}
  local reply = {}
  local admitted = true
  for i = 1, n do
    if i > 1 then
      local clock
      alg, mode, p, cost, at, clock, x, y = read_policy(args, at, i)
      if not alg then
        return redis.error_reply('tower-ratelimit: malformed policy ' .. tostring(args[at]))
      end
    end
    local key = keys[i]
    local st, ends, lease_end
    st, ends, cost, lease_end = prepare(alg, key, p, now, cost, mode, STATES[i], x, LEASED[i])
    local verdict, remaining, reset = judge(alg, p, st, ends, now, cost, key)
    if mode == RESERVE and verdict ~= ADMITTED then
      waits[i] = reservation(alg, p, st, ends, now, cost, key, verdict, x)
    end
    if verdict ~= ADMITTED and not waits[i]
      and (mode == ENFORCE or mode == CHARGE_LATER or mode == LEASE or mode == RESERVE
        or mode == HOLD) then
      admitted = false
    end
    algs[i], params[i], costs[i], modes[i], states[i], blocks[i] = alg, p, cost, mode, st, ends
    bases[i] = #reply
    reply[#reply + 1] = verdict
    reply[#reply + 1] = remaining
    reply[#reply + 1] = reset
    if mode == LEASE or mode == RESERVE or mode == HOLD then
      wants[i], lease_ends[i] = mode == LEASE and y or nil, lease_end
      reply[#reply + 1] = 0
      reply[#reply + 1] = 0
      reply[#reply + 1] = 0
    end
  end
  for i = 1, n do
    local base = bases[i]
    local m = modes[i]
    if admitted and waits[i] then
      reserve(algs[i], keys[i], params[i], states[i], blocks[i], now, costs[i], waits[i], reply,
        base, LEASED[i])
    else
      local charge = admitted and (m == LEASE or (costs[i] > 0
        and (m == ENFORCE or m == RESERVE or m == HOLD
          or (m == SHADOW and reply[base + 1] == ADMITTED))))
      settle(algs[i], keys[i], params[i], states[i], blocks[i], now, costs[i], charge, reply,
        base, wants[i], lease_ends[i])
      if charge and m == HOLD then
        reply[base + 4], reply[base + 5] = costs[i], now
      end
    end
  end
  return reply
end
