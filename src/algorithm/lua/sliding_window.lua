-- Sliding window counter: twin of sliding_window.rs. Params: limit, buckets, bucket.
-- State: the ring of N + 1 counters indexed by bucket index mod (N + 1), after the head
-- bucket's index, written sparse: "head cell:count ...", the counters that are not zero (a
-- key spends a few buckets of its ring, so a decision parses and writes a few numbers, not
-- N + 2). Read as a table { head, c0, c1, ..., cN }. The dense form of earlier versions,
-- "head c0 c1 ... cN", is still read.
-- Built when a decision first uses it (`algorithm` in decide.lua).
ALG[SLIDING_WINDOW] = function()
  -- The parameters of a tag found in a state written under others.
  local OLD_RING = {}

  local function sw_read(raw, cells)
    if not raw then
      return nil
    end
    if not find(raw, ':', 1, true) and find(raw, ' ', 1, true) then
      return parse(raw, cells + 1)
    end
    local head = tonumber(match(raw, '^(%d+)'))
    if not head then
      return nil
    end
    local st = { head }
    for k = 2, cells + 1 do
      st[k] = 0
    end
    for cell, count in string.gmatch(raw, ' (%d+):(%d+)') do
      cell = tonumber(cell)
      if cell >= cells then
        return nil
      end
      st[cell + 2] = tonumber(count)
    end
    return st
  end

  -- Writes the ring of `st` (its counters at st[2] .. st[cells + 1]) after `head`, sparse.
  --@inline
  local function sw_write(key, p, head, st, cells, expires_at, keep, since)
    local bucket = '%d:' .. INT
    local parts = { format(INT, head) }
    for i = 1, cells do
      local count = st[i + 1]
      if count > 0 then
        parts[#parts + 1] = format(bucket, i - 1, count)
      end
    end
    store(key, p, table.concat(parts, ' ') .. p.tag, expires_at, keep, since)
  end

  --@inline
  local function sw_count(p, st, index)
    if st and index <= st[1] and index + p[2] >= st[1] then
      local wraps = fdiv(index, p[2] + 1)
      local cell = index - wraps * (p[2] + 1)
      return st[cell + 2]
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
      -- The buckets c + 1 - n .. c that the ring holds (head - n .. head), walked cell by
      -- cell: one division, not one per bucket.
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
      local cells = n + 1
      local wraps = fdiv(lo, cells)
      local cell = lo - wraps * cells
      for _ = lo, hi do
        whole = whole + st[cell + 2]
        cell = cell + 1
        if cell == cells then
          cell = 0
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
      return sw_read(bare, p[2] + 1) or false
    end
    local tag, ends
    raw, tag, ends = split_state(raw)
    if tag and tag ~= p.tag then
      -- Written under other parameters: read with their ring (their number of buckets is
      -- the tag's second parameter).
      local n = tag_params(tag, OLD_RING) and OLD_RING[2]
      return (n and sw_read(raw, n + 1)) or false, ends, tag
    end
    return sw_read(raw, p[2] + 1) or false, ends
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
  local function commit(self, key, p, st, now, cost, keep, since)
    local n, g = p[2], p[3]
    local cells = n + 1
    local c = sw_position(p, st, now)
    local wraps = fdiv(c, cells)
    local cell = c - wraps * cells
    if not st then
      -- A new key: one bucket, written without building its ring.
      local value = format(INT .. ' %d:' .. INT, c, cell, cost) .. p.tag
      store(key, p, value, (c + cells) * g, keep, since)
    else
      -- The ring read for this decision, updated in place: buckets that left it emptied.
      local head = st[1]
      if c > head then
        local stale = c - head
        if stale > cells then
          stale = cells
        end
        -- Bucket c - i is at the ring's cell `cell - i`, wrapped.
        local back = cell
        for _ = 1, stale do
          st[back + 2] = 0
          back = back - 1
          if back < 0 then
            back = cells - 1
          end
        end
        head = c
      end
      st[cell + 2] = st[cell + 2] + cost
      sw_write(key, p, head, st, cells, (head + cells) * g, keep, since)
    end
  end

  return {
    block = block_in_value,
    load = load,
    -- Twin of `SlidingWindow::convert`: each old bucket still in the window moves, with its
    -- count, to the new bucket holding its last microsecond (the present's for the present's).
    convert = function(self, key, q, p, st, now, keep, since)
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
      local cells = n + 1
      local ring = { head }
      for k = 2, cells + 1 do
        ring[k] = 0
      end
      for k = 1, #moved, 2 do
        local j = moved[k]
        if j + n < head then
          -- Older than the new ring holds: into its oldest bucket.
          j = head - n
        end
        local cell = j - fdiv(j, cells) * cells + 2
        local c = ring[cell] + moved[k + 1]
        if c > 4294967295 then
          c = 4294967295
        end
        ring[cell] = c
      end
      sw_write(key, p, head, ring, cells, (head + cells) * g, keep, since)
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
    give_back = function(self, key, p, st, now, lease_end, units, keep, since)
      if not st then
        return
      end
      local n, g = p[2], p[3]
      local cells = n + 1
      local b = fdiv(lease_end, g)
      local head = st[1]
      if b > head or b + n < head then
        return
      end
      local cell = b - fdiv(b, cells) * cells + 2
      local take = st[cell]
      if take > units then
        take = units
      end
      st[cell] = st[cell] - take
      sw_write(key, p, head, st, cells, (head + cells) * g, keep, since)
    end,
    refund = function(self, key, p, st, now, units, keep, since)
      if not st then
        return
      end
      local n, g = p[2], p[3]
      local cells = n + 1
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
        local cell = i - fdiv(i, cells) * cells + 2
        local take = st[cell]
        if take > left then
          take = left
        end
        st[cell] = st[cell] - take
        left = left - take
        i = i - 1
      end
      sw_write(key, p, head, st, cells, (head + cells) * g, keep, since)
    end,
    commit = commit,
  }
end
