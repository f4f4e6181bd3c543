-- Fixed window: twin of fixed_window.rs. Params: limit, window; for a calendar, limit, 0, the
-- calendar's id, then the boundaries the call carries (b0 .. b3: the periods before, holding
-- and after the caller's time). State: "start count".
-- Built when a decision first uses it (`algorithm` in decide.lua).
ALG[FIXED_WINDOW] = function()
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

  -- The running window's start, count and end; a state from a later window (a booked
  -- time, or the clock went back) is kept as the running one. The window holding `now` is
  -- `bounds`, written out for the usual window of the usual call.
  --@inline
  local function current(p, st, now)
    local w = p[2]
    local start, count, ends
    if w > 0 then
      start = now - now % w
      ends = start + w
    else
      start, ends = period(p, now)
    end
    count = 0
    if st and st[1] >= start then
      if st[1] > start then
        start, ends = bounds(p, st[1])
      end
      count = st[2]
    end
    return start, count, ends
  end

  -- A state from a later window (a booked time, or the clock went back) starts there.
  --@inline
  local function lag(p, st, now)
    local behind = 0
    if st and st[1] > now then
      behind = st[1] - now
    end
    return behind
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
    local ok = 0
    local reset = left
    local retry = -1
    if count + cost <= limit then
      ok = 1
      remaining = remaining - cost
      if count + cost == 0 then
        reset = 0
      end
    else
      if count == 0 then
        reset = 0
      end
      if cost <= limit then
        retry = left
      end
    end
    return ok, remaining, reset, retry, start, count, ends
  end

  -- Charged from the window phase one saw (`seen`: its start, count and end), else from the
  -- window holding `now`.
  --@inline
  local function commit(self, key, p, st, now, cost, keep, since, seen, count, stop)
    if seen then
      store(key, p, format(p.f2, seen, count + cost), stop, keep, since)
    else
      local start, n, till = current(p, st, now)
      store(key, p, format(p.f2, start, n + cost), till, keep, since)
    end
  end

  return {
    block = block_in_value,
    load = load,
    bounds = bounds,
    current = current,
    lag = lag,
    evaluate = evaluate,
    -- Twin of `FixedWindow::convert`: the running window's count carried into the new window
    -- that holds the present (or the state's later window). A calendar's window ended when
    -- the present one's window holding the present starts after it.
    convert = function(self, key, q, p, st, now, keep, since)
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
      store(key, p, format(p.f2, start, st[2]), ends, keep, since)
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
    give_back = function(self, key, p, st, now, lease_end, units, keep, since)
      if self.current(p, st, now) == self.bounds(p, lease_end) then
        self:refund(key, p, st, now, units, keep, since)
      end
    end,
    refund = function(self, key, p, st, now, units, keep, since)
      if not st then
        return
      end
      local start, count, ends = self.current(p, st, now)
      local left = count - units
      if left < 0 then
        left = 0
      end
      store(key, p, format(p.f2, start, left), ends, keep, since)
    end,
    commit = commit,
  }
end
