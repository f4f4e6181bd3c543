-- Fixed window: twin of fixed_window.rs. Params: limit, window. State: "start count".
-- Built when a decision first uses it (`algorithm` in decide.lua).
ALG[FIXED_WINDOW] = function()
  --@inline
  local load = read2

  -- The running window's start and count.
  --@inline
  local function current(p, st, now)
    local start = fdiv(now, p[2])
    start = start * p[2]
    if st and st[1] >= start then
      return st[1], st[2]
    end
    return start, 0
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
    local limit, window = p[1], p[2]
    local start, count = current(p, st, now)
    -- As of the state's own time when it is ahead (see `lag`).
    local from = now
    if start > from then
      from = start
    end
    local left = start + window - from
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
    local start, count = current(p, st, now)
    store(key, p, format(INT2, start, count + cost), now, start + p[2])
  end

  return {
    block = block_in_value,
    load = load,
    current = current,
    lag = lag,
    evaluate = evaluate,
    -- Twin of `FixedWindow::convert`: the running window's count carried into the new window
    -- that holds the present (or the state's later window).
    convert = function(self, key, q, p, st, now)
      if st[1] + q[2] <= now then
        return false
      end
      local at = st[1]
      if now > at then
        at = now
      end
      local start = fdiv(at, p[2]) * p[2]
      store(key, p, format(INT2, start, st[2]), now, start + p[2])
      return true
    end,
    -- A lease ends with the window its units are counted in.
    lease_end = function(self, p, st, now, ttl)
      local start = self.current(p, st, now)
      local from = now
      if start > from then
        from = start
      end
      local e = from + ttl
      if e > start + p[2] - 1 then
        e = start + p[2] - 1
      end
      return e
    end,
    -- Gives back to the lease's window only: once another has begun, the units went with it.
    give_back = function(self, key, p, st, now, lease_end, units)
      if self.current(p, st, now) == fdiv(lease_end, p[2]) * p[2] then
        self:refund(key, p, st, now, units)
      end
    end,
    refund = function(self, key, p, st, now, units)
      if not st then
        return
      end
      local start, count = self.current(p, st, now)
      local left = count - units
      if left < 0 then
        left = 0
      end
      store(key, p, format(INT2, start, left), now, start + p[2])
    end,
    commit = commit,
  }
end
