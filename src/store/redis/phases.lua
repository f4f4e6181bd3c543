-- The two phases of a decision for one policy, written once: `decide` (decide.lua) runs
-- phase one for each policy of a call, then phase two for each (`phases`), and a policy
-- enforced alone (`enforced`). The generator (luagen/) writes them into each algorithm's
-- twin, with the twin's own `load`, `evaluate`, `commit` and `lag` written in place of
-- their calls, so that a decision makes almost no Lua call of its own beyond Redis's
-- commands. An operation
-- these phases do not judge themselves (`FUSES`: all but ENFORCE) is judged by its arms in
-- grant.lua once its state is read; every operation is charged, or reported as it stays,
-- here.

-- The verdict of a policy as the reply gives it (ADMITTED, the retry-after, or NEVER),
-- remaining and reset; a blocked key is denied until the block ends, whatever its state
-- (twin of `apply_block`). Then what `evaluate` saw of the state at `now` (up to three
-- values of the twin's own, nil when it gives none), for phase two to hand `commit`.
--@inline
local function verdict(self, p, st, ends, now, cost, key)
  local ok, remaining, reset, retry, seen1, seen2, seen3 = evaluate(self, p, st, now, cost, key)
  --@if lag
  local behind = lag(p, st, now)
  if behind > 0 then
    ok, remaining, reset, retry = shift(behind, cost, ok, remaining, reset, retry)
  end
  --@end
  if ends and ends > now then
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
  local v = retry
  if ok == 1 then
    v = ADMITTED
  elseif retry < 0 then
    v = NEVER
  end
  return v, remaining, reset, seen1, seen2, seen3
end

-- The state of the policy at position i, loaded in STATES[i] (converted first when written
-- under other parameters), its block's end, and the parameters it is decided under (a key's
-- own limit's, if it has one).
--@inline
local function loaded(self, i, key, p, now, since)
  local st, ends, stale = load(key, p, now, STATES[i])
  if stale then
    st, ends, p = adopt(self, key, p, st, ends, now, stale, STATES[i], since)
  end
  return st, ends, p
end

-- Phase one for an enforced policy (its operation one the phases decide themselves,
-- `FUSES`), its state `st` and block `ends` loaded, decided under `q`, whose reply follows
-- REPLY[base]: its verdict in the reply. Returns whether it admits the request, and what
-- `evaluate` saw (see `verdict`).
--@inline
local function phase_one(self, q, st, ends, now, cost, key, base)
  local v, remaining, reset, seen1, seen2, seen3 = verdict(self, q, st, ends, now, cost, key)
  REPLY[base + AT_VERDICT] = v
  REPLY[base + AT_REMAINING] = remaining
  REPLY[base + AT_RESET] = reset
  return v == ADMITTED, seen1, seen2, seen3
end

-- Phase two for the policy at place i, of operation `op`, whose reply follows REPLY[base]
-- and whose checks' reply ends at `total`, the request `admitted` or not. Admitted, charged
-- as its operation says: at the time phase one booked (`wait` from now), a lease ending
-- at `lease_end` (of up to YS[i] units), or its cost when its operation charges (with what
-- `evaluate` saw, `seen1` to `seen3`, nil when it did not look), keeping its block on
-- record. Otherwise the state reported as it stays, its key given a TTL (from `since`) if
-- it lost its own; and a policy the phases judged themselves (`fused`: enforced) that
-- blocks on violation as `e` says strikes (`strike`). Returns the reply's end.
--@inline
local function phase_two(self, i, op, fused, key, p, now, since, cost, st, ends, admitted, base, seen1, seen2, seen3, lease_end, wait, e, total)
  if admitted then
    if wait then
      book(self, key, p, st, ends, now, cost, wait, base, since)
      return total
    end
    if lease_end then
      take_lease(self, key, p, st, ends, now, cost, YS[i], lease_end, base, since)
      return total
    end
    if cost > 0 and (fused or charged(op, base)) then
      commit(self, key, p, st, now, cost, ends, since, seen1, seen2, seen3)
      if op == CONCURRENCY then
        REPLY[base + AT_UNITS], REPLY[base + AT_END] = cost, now
      end
      return total
    end
  end
  uncharged(self, key, p, st, ends, now, since, cost, base)
  if e and fused and not admitted then
    return strike(self, key, p, e, ends, now, since, base, i, total)
  end
  return total
end

-- The policies of a decision from position i to n (read into ALGS, OPS, PS, COSTS, XS and
-- YS; policy i's operation, key, cost and parameters given), `admitted` by those before it
-- or not: phase one for policy i, whose reply follows REPLY[base]; then the policies after
-- it, each one call deeper; then phase two for policy i, once the request is known to be
-- admitted or not (by every policy that decides), so what each phase hands the other stays
-- in locals. Phase two runs from the last policy to the first: each has its own key.
-- Returns whether the request is admitted, where the reply of the checks ends, and whether
-- a key was decided under its own limit (then PS[i] holds the parameters of each policy
-- from i on as it was decided).
local function phases(self, i, n, keys, now, since, admitted, base, op, key, cost, p)
  local st, ends, q = loaded(self, i, key, p, now, since)
  local fused = FUSES[op]
  local ok, seen1, seen2, seen3, lease_end, wait
  if fused then
    ok, seen1, seen2, seen3 = phase_one(self, q, st, ends, now, cost, key, base)
  else
    ok, st, lease_end, wait = phase_one_of(self, i, op, key, q, now, cost, XS[i], base, st, ends)
  end
  if not ok and DECIDES[op] then
    admitted = false
  end
  local total, own = base + WIDTH[op], false
  if i < n then
    local j = i + 1
    admitted, total, own = ALGS[j]:phases(j, n, keys, now, since, admitted, total, OPS[j], keys[j], COSTS[j], PS[j])
  end
  total = phase_two(self, i, op, fused, key, q, now, since, cost, st, ends, admitted, base, seen1, seen2, seen3, lease_end, wait, p.escalate, total)
  if q ~= p then
    PS[i], own = q, true
  end
  return admitted, total, own
end

-- A policy enforced alone, the most usual call, from its arguments (`args`, its shape
-- `shape` first): its cost and parameters read, the time, then its two phases (as `phases`
-- runs them; written here again, inlined, because this call is the most usual). Returns the
-- reply; nil, having done nothing, when the arguments are malformed.
local function enforced(self, key, args, shape)
  local cost, at = 1, 2
  if shape % CLOCK_FLAG >= COST_FLAG then
    cost = tonumber(args[2])
    if not cost then
      return nil
    end
    at = 3
  end
  local p = read_params(args[at])
  if not p then
    return nil
  end
  local now, since = clock(args, shape >= CLOCK_FLAG)
  local st, ends, q = loaded(self, 1, key, p, now, since)
  local ok, seen1, seen2, seen3 = phase_one(self, q, st, ends, now, cost, key, 0)
  REPLY[CHECK_WIDTH + 1] = nil
  local total = phase_two(self, 1, ENFORCE, true, key, q, now, since, cost, st, ends, ok, 0, seen1, seen2, seen3, nil, nil, p.escalate, CHECK_WIDTH)
  if q ~= p then
    PS[1] = q
    own_limits(1, total)
  end
  return REPLY
end
