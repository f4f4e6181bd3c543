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
  local id = shape % MODE_UNIT
  local alg = BUILT[id] or algorithm(id)
  local op = (shape % COST_FLAG - id) / MODE_UNIT
  if not alg or not ARGS[op] then
    return nil
  end
  local cost = 1
  at = at + 1
  if shape % CLOCK_FLAG >= COST_FLAG then
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
  return alg, op, p, cost, x, y, at + 1, shape >= CLOCK_FLAG
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
    return ADMITTED, remaining, reset
  end
  if retry < 0 then
    return NEVER, remaining, reset
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
  if judge(alg, p, st, ends, now + verdict, cost, key) == ADMITTED then
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
  reply[at + AT_VERDICT], reply[at + AT_REMAINING] = ADMITTED, remaining
  reply[at + AT_RESET] = reset
  reply[at + AT_UNITS], reply[at + AT_END], reply[at + AT_LASTS] = cost, at_time, wait
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
  reply[at + AT_VERDICT], reply[at + AT_REMAINING], reply[at + AT_RESET] = verdict, remaining, reset
  reply[at + AT_UNITS], reply[at + AT_END], reply[at + AT_LASTS] = units, lease_end, lease_end - now
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
  if op == LEASE then
    lease_end = now + x
    if alg.lease_end then
      lease_end = alg:lease_end(p, st, now, x)
    end
    if alg.lease_state then
      st = alg:lease_state(p, st, now, lease_end, LEASED[i])
    end
  end
  local verdict, remaining, reset = judge(alg, p, st, ends, now, cost, key)
  REPLY[base + AT_VERDICT], REPLY[base + AT_REMAINING], REPLY[base + AT_RESET] = verdict, remaining,
    reset
  if GRANTS[op] then
    REPLY[base + AT_UNITS], REPLY[base + AT_END], REPLY[base + AT_LASTS] = 0, 0, 0
  end
  if verdict == ADMITTED then
    return true, st, ends, lease_end
  end
  if op == WAIT then
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
    if op == LEASE then
      take_lease(alg, key, p, st, ends, now, cost, y, lease_end, REPLY, base)
      return
    end
    local charges = CHARGES[op]
    if cost > 0 and (charges == 2 or (charges == 1 and REPLY[base + AT_VERDICT] == ADMITTED)) then
      KEEP_BLOCK = ends
      alg:commit(key, p, st, now, cost)
      KEEP_BLOCK = nil
      if op == CONCURRENCY then
        REPLY[base + AT_UNITS], REPLY[base + AT_END] = cost, now
      end
      return
    end
  end
  if REPLY[base + AT_VERDICT] == ADMITTED and cost > 0 then
    -- Admitted by this policy but not charged: report the state as it stays.
    local ok, remaining, reset, retry = alg:evaluate(p, st, now, 0, key)
    if alg.lag then
      ok, remaining, reset = shift(alg.lag(p, st, now), 0, ok, remaining, reset, retry)
    end
    REPLY[base + AT_REMAINING] = remaining
    REPLY[base + AT_RESET] = reset
  end
  if call('PTTL', key) == -1 then
    -- A key without a TTL (written by something else, or lost its TTL): repair it.
    call('PEXPIRE', key, ttl_ms(now, now + REPLY[base + AT_RESET]))
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
      REPLY[total + AT_OWN_PLACE], REPLY[total + AT_OWN_LIMIT] = i, q[1]
      REPLY[total + AT_OWN_WINDOW], REPLY[total + AT_OWN_BURST] = q[2], q[3]
      total = total + OWN_WIDTH
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
  local id = shape % MODE_UNIT
  local fused = false
  if FUSES[(shape % COST_FLAG - id) / MODE_UNIT] then
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
    if shape % CLOCK_FLAG >= COST_FLAG then
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
      injected = shape >= CLOCK_FLAG
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
    base = base + CHECK_WIDTH
  end
  REPLY[base + 1] = nil
  for i = 1, n do
    if admitted then
      ALGS[i]:commit(keys[i], PS[i], STS[i], now, COSTS[i])
    else
      apply(i, ALGS[i], ENFORCE, keys[i], PS[i], now, COSTS[i], nil, STS[i], nil, nil, nil, false,
        CHECK_WIDTH * (i - 1))
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
