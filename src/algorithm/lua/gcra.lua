-- GCRA: twin of gcra.rs. Params: interval, tolerance (burst · interval, so a cost above the
-- burst is one whose cost · interval exceeds it). State: "tat" (a number, not a table).
-- Built when a decision first uses it (`algorithm` in decide.lua).
ALG[GCRA] = function()
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
  local function commit(self, key, p, st, now, cost, keep, since)
    local tat = now
    if st and st > now then
      tat = st
    end
    tat = tat + cost * p[1]
    store(key, p, format(p.f1, tat), tat, keep, since)
  end

  return {
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
    convert = function(self, key, q, p, st, now, keep, since)
      if not st or st <= now then
        return false
      end
      local tat = now + rescale(st - now, q[1], p[1])
      store(key, p, format(p.f1, tat), tat, keep, since)
      return true
    end,
    -- Gives back the latest booked time only: its charge put the TAT at `at + tolerance`.
    release = function(self, key, p, st, now, at, units, keep, since)
      if st and st == at + p[2] then
        self:refund(key, p, st, now, units, keep, since)
      end
    end,
    refund = function(self, key, p, st, now, units, keep, since)
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
      store(key, p, format(p.f1, tat), tat, keep, since)
    end,
    commit = commit,
  }
end
