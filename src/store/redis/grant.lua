-- The phases of a policy whose operation is not ENFORCE (phases.lua takes those here once its
-- state is read): a look, a shadow, an act's look at cost 0, and what the granting
-- operations do beyond a verdict: the time a WAIT books, the units a LEASE takes, the
-- slots CONCURRENCY holds.

-- A table to load a state in, for a moment.
local SCRATCH = {}

-- For a WAIT policy denied now with `verdict`: the wait until the time that admits it, when
-- it is a retry-after of at most `max_wait` (a block's end included: a paused key's calls
-- wait for it) and the cost is not 0 (a look books nothing) (twin of `booking` in Rust);
-- else nil.
local function booking(alg, p, st, ends, now, cost, key, verdict, max_wait)
  if cost == 0 or verdict < 0 or verdict > max_wait then
    return nil
  end
  if alg:verdict(p, st, ends, now + verdict, cost, key) == ADMITTED then
    return verdict
  end
  return nil
end

-- Phase two for a WAIT policy admitted at the time `wait` microseconds away, whose reply
-- follows REPLY[at]: charges it there (the key's TTL still counted from `since`), then
-- reports the state as it is seen now, with the units, the time and the wait after the
-- verdict.
local function book(alg, key, p, st, ends, now, cost, wait, at, since)
  local at_time = now + wait
  if alg.book_commit then
    alg:book_commit(key, p, st, now, at_time, cost, ends, since)
  else
    alg:commit(key, p, st, at_time, cost, ends, since)
  end
  -- Admitted, the state reported as it is seen now (a look may deny: the sliding log still
  -- counts, now, entries that are gone at that time; a paused key has nothing left now).
  local seen = alg.load(key, p, now, SCRATCH)
  local _, remaining, reset = alg:verdict(p, seen, ends, now, 0, key)
  REPLY[at + AT_VERDICT], REPLY[at + AT_REMAINING] = ADMITTED, remaining
  REPLY[at + AT_RESET] = reset
  REPLY[at + AT_UNITS], REPLY[at + AT_END], REPLY[at + AT_LASTS] = cost, at_time, wait
end

-- Phase two for an admitted LEASE of up to `want` units ending at `lease_end`, whose reply
-- follows REPLY[at]: leases what is left, at least the cost and at most the units wanted,
-- and reports the verdict with the lease counted as spent (twin of `take_lease` in Rust).
local function take_lease(alg, key, p, st, ends, now, cost, want, lease_end, at, since)
  local _, left = alg:evaluate(p, st, now, 0, key)
  local units = left
  if units > want then
    units = want
  end
  if units < cost then
    units = cost
  end
  local verdict, remaining, reset = alg:verdict(p, st, ends, now, units, key)
  if verdict ~= ADMITTED and units > cost then
    units = cost
    verdict, remaining, reset = alg:verdict(p, st, ends, now, units, key)
  end
  if units > 0 then
    if alg.lease_commit then
      alg:lease_commit(key, p, st, now, lease_end, units, ends, since)
    else
      alg:commit(key, p, st, now, units, ends, since)
    end
  end
  REPLY[at + AT_VERDICT], REPLY[at + AT_REMAINING], REPLY[at + AT_RESET] = verdict, remaining, reset
  REPLY[at + AT_UNITS], REPLY[at + AT_END], REPLY[at + AT_LASTS] = units, lease_end, lease_end - now
end

-- Phase two for a policy not charged, whose reply follows REPLY[base]: the state reported
-- as it stays when the policy admitted the request, its key given a TTL (from `since`) if
-- it lost its own. A key the load found nothing under (`st` nil: a state that is there but
-- unreadable is false; no block `ends`) has no TTL to lose, and costs no PTTL.
local function uncharged(alg, key, p, st, ends, now, since, cost, base)
  if REPLY[base + AT_VERDICT] == ADMITTED and cost > 0 then
    local _, remaining, reset = alg:verdict(p, st, nil, now, 0, key)
    REPLY[base + AT_REMAINING], REPLY[base + AT_RESET] = remaining, reset
  end
  if (st ~= nil or ends) and call('PTTL', key) == -1 then
    -- A key without a TTL (written by something else, or lost its TTL): repair it.
    call('PEXPIRE', key, ttl_ms(since, now + REPLY[base + AT_RESET]))
  end
end

-- Phase one for the policy at position i of operation `op` (not ENFORCE), its state `st` and
-- block `ends` read: decided on the state as strict as a lease could make it, in LEASED[i],
-- for a LEASE whose longest life is `x` (twin of `lease_verdict` in Rust), as if `x` more
-- units were asked for when it KEEPS them (`Op::judged`), its verdict in the reply,
-- and for a WAIT denied now, the wait of at most `x` until the time that would admit it.
-- Returns whether it admits the request, the state decided on, and for phase two the end of
-- the lease taken and the wait booked (nil when none).
local function phase_one_of(alg, i, op, key, p, now, cost, x, base, st, ends)
  local lease_end, wait
  local judged = cost
  if KEEPS[op] then
    judged = cost + x
  end
  if op == LEASE then
    lease_end = now + x
    if alg.lease_end then
      lease_end = alg:lease_end(p, st, now, x)
    end
    if alg.lease_state then
      st = alg:lease_state(p, st, now, lease_end, LEASED[i])
    end
  end
  local v, remaining, reset = alg:verdict(p, st, ends, now, judged, key)
  REPLY[base + AT_VERDICT], REPLY[base + AT_REMAINING], REPLY[base + AT_RESET] = v, remaining, reset
  if GRANTS[op] then
    REPLY[base + AT_UNITS], REPLY[base + AT_END], REPLY[base + AT_LASTS] = 0, 0, 0
  end
  if v ~= ADMITTED and op == WAIT then
    wait = booking(alg, p, st, ends, now, cost, key, v, x)
  end
  return v == ADMITTED or wait ~= nil, st, lease_end, wait
end

-- Whether a policy of operation `op` (not ENFORCE), the request admitted, is charged its
-- cost: always, or when its own verdict (in the reply that follows REPLY[base]) admits.
local function charged(op, base)
  local charges = CHARGES[op]
  return charges == 2 or (charges == 1 and REPLY[base + AT_VERDICT] == ADMITTED)
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
  return total
end

-- The block of `level` as `e` says, and the level it stops at: the first whose block is
-- the longest (twin of `Escalation::top_level`), at most some 40 turns, a factor of 1 none.
local function level_block(e, level)
  local d, top = e[3], 1
  while top < level and d < e[4] and e[6] > 1 do
    d, top = d * e[6], top + 1
  end
  if d > e[4] then
    d = e[4]
  end
  return d, top
end

-- The strike of the policy at place i, which blocks on violation as `e` says (its denials,
-- their span, the first block, the longest, how long a level is remembered, the factor; see
-- `Escalation`), whose reply follows REPLY[base] (twin of `Shard::strike`). Denied by its
-- state (not NEVER: a cost above the capacity is no violation) and not within a block (the
-- end `ends` its phase one read: a denial under a block is none), the key's record
-- ("<key>!", in its hash slot: denials, the first's time, the last block's level, start and
-- end) counts one more denial in the span; the count
-- blocks the key, for the next level's time (the first once `forget` has passed since the
-- last block), and the reply tells the block: then the reply's end, `total`, gets its place,
-- negated, its level and its end (OWN_WIDTH integers). Returns the reply's end.
local function strike(alg, key, p, e, ends, now, since, base, i, total)
  local v = REPLY[base + AT_VERDICT]
  if v == ADMITTED or v == NEVER or (ends and ends > now) then
    return total
  end
  local record = key .. '!'
  local r = parse(call('GET', record), 5)
  local n, first, level, last, till = 0, now, 0, 0, 0
  if r then
    n, first, level, last, till = r[1], r[2], r[3], r[4], r[5]
  end
  if first + e[2] <= now then
    n, first = 0, now
  end
  n = n + 1
  if n >= e[1] then
    if last > 0 and last + e[5] > now then
      level = level + 1
    else
      level = 1
    end
    local d
    d, level = level_block(e, level)
    n, first, last, till = 0, now, now, now + d
    alg:block(key, p, nil, now, till, nil, since)
    -- The verdict as the block makes it (twin of `apply_block`).
    if v < d then
      REPLY[base + AT_VERDICT] = d
    end
    REPLY[base + AT_REMAINING] = 0
    if REPLY[base + AT_RESET] < d then
      REPLY[base + AT_RESET] = d
    end
    REPLY[total + AT_OWN_PLACE], REPLY[total + AT_OWN_LIMIT] = -i, level
    REPLY[total + AT_OWN_WINDOW], REPLY[total + AT_OWN_BURST] = till, 0
    total = total + OWN_WIDTH
  end
  local keep = first + e[2]
  if last + e[5] > keep then
    keep = last + e[5]
  end
  if till > keep then
    keep = till
  end
  call('SET', record, format(INT .. ' ' .. INT .. ' ' .. INT .. ' ' .. INT .. ' ' .. INT, n, first, level, last, till),
    'PX', format(INT, ttl_ms(since, keep)))
  REPLY[total + 1] = nil
  return total
end
