-- The fused decisions of policies enforced (`FUSES[op]`), the usual request: the phases of
-- `decide` for that case, in functions per algorithm. The generator (luagen/) writes them
-- into each twin, with the twin's own `load`, `evaluate`, `commit` and `lag` written in place
-- of their calls. A key blocked, or written under other parameters, is left to the general
-- path: nil, having written nothing.

-- One policy alone. `args` are the policy's arguments, `shape` their first.
local function fused(key, args, shape)
  local cost, at = 1, 2
  if shape % CLOCK_FLAG >= COST_FLAG then
    cost = tonumber(args[2])
    at = 3
  end
  local p = read_params(args[at])
  if not p then
    return nil
  end
  local now = clock(args, shape >= CLOCK_FLAG)
  local st, ends, stale = load(key, p, now, STATES[1])
  if ends or stale then
    return nil
  end
  local ok, remaining, reset, retry = evaluate(nil, p, st, now, cost, key)
  --@if lag
  local behind = lag(p, st, now)
  if behind > 0 then
    ok, remaining, reset, retry = shift(behind, cost, ok, remaining, reset, retry)
  end
  --@end
  REPLY[AT_REMAINING], REPLY[AT_RESET], REPLY[CHECK_WIDTH + 1] = remaining, reset, nil
  if ok ~= 1 then
    if retry < 0 then
      REPLY[AT_VERDICT] = NEVER
    else
      REPLY[AT_VERDICT] = retry
    end
  else
    REPLY[AT_VERDICT] = ADMITTED
    if cost > 0 then
      commit(nil, key, p, st, now, cost)
      return REPLY
    end
  end
  -- Not charged: a key that lost its TTL gets one (as `apply` does).
  if call('PTTL', key) == -1 then
    local ms = ttl_ms(now, now + reset)
    call('PEXPIRE', key, ms)
  end
  return REPLY
end

-- Phase one of several policies enforced (`decide_fused` in decide.lua), for the one at
-- position i whose reply follows REPLY[base]: its verdict, remaining and reset in the
-- reply; returns whether it admits and the state decided on.
local function judged(key, p, now, cost, i, base)
  local st, ends, stale = load(key, p, now, STATES[i])
  if ends or stale then
    return nil
  end
  local ok, remaining, reset, retry = evaluate(nil, p, st, now, cost, key)
  --@if lag
  local behind = lag(p, st, now)
  if behind > 0 then
    ok, remaining, reset, retry = shift(behind, cost, ok, remaining, reset, retry)
  end
  --@end
  REPLY[base + AT_REMAINING], REPLY[base + AT_RESET] = remaining, reset
  if ok == 1 then
    REPLY[base + AT_VERDICT] = ADMITTED
    return true, st
  end
  if retry < 0 then
    REPLY[base + AT_VERDICT] = NEVER
  else
    REPLY[base + AT_VERDICT] = retry
  end
  return false, st
end

