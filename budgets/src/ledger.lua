-- Budget ledgers in Redis, updated atomically by one script call: every ledger of a request in
-- one call (one round trip, one AOF write and, with `appendfsync always`, one fsync per call
-- instead of one per ledger), all or nothing inside the script. The same semantics as the
-- gateway core's `budget::ledger` (bucketed window that never expires a charge early, each
-- bucket rolling off a window after its latest charge; holds that expire after their
-- time-to-live; Retry-After to the second and never longer than the window), checked against
-- the same table of cases (budgets/tests/cases.json).
--
-- Per ledger, three keys sharing one hash tag (KEYS[3i+1..3i+3] for ledger i):
-- <ledger>:w  HASH  t<bucket> = tokens, u<bucket> = pico-USD spent in that bucket,
--                   m<bucket> = the time (ms) of its latest charge (absent: written before
--                   these were kept, taken to be the bucket's end);
--                   st, su = the sums of the live buckets (running sums: a call reads them
--                   and the buckets that died since the last call, not every bucket);
--                   lo = the oldest bucket that may still be live (everything below is gone);
--                   ht, hu = tokens and pico-USD held by reservations;
--                   v = the version of the last answer (see `stamp`);
--                   bw, wl = bucket width and window (ms) the buckets were written under: a
--                   call under another window re-buckets them by time first (`rebucket`);
--                   lu = until when a lease may hold room here (the newest lease's expiry;
--                   absent once the last one is released);
--                   rc = until when leases are asked to give back their unused room (see
--                   `reclaim`)
-- <ledger>:r  HASH  reservation id -> "<tokens> <pico>", or "-" once it ended
-- <ledger>:x  ZSET  reservation id scored by its expiry (ms)
--
-- Reservation ids are chosen by the gateway, so a release can be sent for a reservation whose
-- answer never came back (the client left). An ended id stays as a tombstone ("-") for the
-- hold ttl: a reserve arriving after its release holds nothing, and a settle repeated (a retry
-- whose first answer was lost) charges once. Tombstones are never scanned: only the expired
-- range of :x is read, so each id is read once when its ttl ends.
--
-- ARGV[1] op: reserve | check | settle | release | status | lease (see its branch below)
-- ARGV[2] now in ms, or -1 for Redis server TIME (the one clock every gateway shares)
-- ARGV[3] reservation id, ARGV[4] tokens, ARGV[5] pico (decimal string), ARGV[6] hold ttl ms
-- then per ledger i: ARGV[7+4i] bucket width ms, ARGV[8+4i] window ms,
--                    ARGV[9+4i] token cap or -1, ARGV[10+4i] pico cap or -1
--
-- Answer: 7 strings per ledger: code, wait, spent tokens, spent pico, held tokens, held pico,
-- version. Reserve codes: 1 held (or, for check, fits), 2 the id had ended (nothing held),
-- 0 refused (wait = seconds, -1 never), 3 fits but not held (another ledger refused), 4 refused
-- while what is spent alone admits it and leases hold room (wait 1): the leases are asked to
-- give their unused room back (`reclaim`), so the same reserve soon fits. Settle and release: 1
-- when the hold was found.
--
-- Pico-dollar sums can pass 2^53, where Lua's doubles stop being exact, so they are kept as
-- {high, low} pairs of base 10^9 digits; Redis stores them as decimal strings.

local BASE = 1000000000

local function P(s)
  s = s or '0'
  local n = #s
  if n <= 9 then return {0, tonumber(s)} end
  return {tonumber(string.sub(s, 1, n - 9)), tonumber(string.sub(s, n - 8))}
end
local function padd(a, b)
  local hi, lo = a[1] + b[1], a[2] + b[2]
  if lo >= BASE then lo = lo - BASE; hi = hi + 1 end
  return {hi, lo}
end
local function psub(a, b)
  local hi, lo = a[1] - b[1], a[2] - b[2]
  if lo < 0 then lo = lo + BASE; hi = hi - 1 end
  if hi < 0 then return {0, 0} end
  return {hi, lo}
end
local function ple(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] <= b[2]) end
local function pzero(a) return a[1] == 0 and a[2] == 0 end
local function pstr(a)
  if a[1] == 0 then return string.format('%d', a[2]) end
  return string.format('%d%09d', a[1], a[2])
end
local function istr(x) return string.format('%d', x) end

local op = ARGV[1]
local now = tonumber(ARGV[2])
-- The clock in microseconds, for versions only.
local now_us
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now_us = now * 1000
end
local id = ARGV[3]
local amt_t, amt_p = tonumber(ARGV[4] or '0'), P(ARGV[5])
local ttl = tonumber(ARGV[6] or '0')

-- When bucket `k` rolls off at the latest (whatever its latest charge time).
local function expires(L, k) return (k + 1) * L.width + L.life end
-- When bucket `k`, whose latest charge was at `m` (nil: unknown), rolls off.
local function expires_m(L, k, m)
  local e = expires(L, k)
  if m then return math.min(m + L.life, e) end
  return e
end

-- Every bucket of the hash, dead ones deleted: the live ones oldest first and their sums.
-- Needed for Retry-After (which bucket must roll off), for a ledger written before running
-- sums, and when the ledger was idle longer than a window (a walk would be longer than this).
local function scan(L)
  local all, order = {}, {}
  local fields = redis.call('HGETALL', L.W)
  for i = 1, #fields, 2 do
    local f, v = fields[i], fields[i + 1]
    local kind = string.sub(f, 1, 1)
    if kind == 't' or kind == 'u' or kind == 'm' then
      local k = tonumber(string.sub(f, 2))
      local b = all[k]
      if not b then b = {0, {0, 0}, nil}; all[k] = b end
      if kind == 't' then b[1] = tonumber(v) elseif kind == 'u' then b[2] = P(v) else b[3] = tonumber(v) end
    end
  end
  local buckets, dead = {}, {}
  for k, b in pairs(all) do
    if now >= expires_m(L, k, b[3]) then
      for _, f in ipairs({'t', 'u', 'm'}) do table.insert(dead, f .. istr(k)) end
    else
      buckets[k] = b
      table.insert(order, k)
    end
  end
  if #dead > 0 then redis.call('HDEL', L.W, unpack(dead)) end
  table.sort(order)
  local st, sp = 0, {0, 0}
  for _, k in ipairs(order) do
    st = st + buckets[k][1]
    sp = padd(sp, buckets[k][2])
  end
  L.buckets, L.order = buckets, order
  return st, sp
end

-- Keeps the ledger's keys at least `ms` longer (never shortens them: a status call passes no
-- hold ttl, and the holds in :r/:x must outlive their ttl).
local function outlive(L, ms)
  local cur = redis.call('PTTL', L.W)
  if cur >= 0 and cur < ms then
    for _, k in ipairs({L.W, L.R, L.X}) do redis.call('PEXPIRE', k, ms) end
  end
end

-- The buckets were written under another width (the budget's window changed; a gateway with
-- the old config may still be writing): each bucket moves to the bucket of this width holding
-- its latest charge (its last instant when that is unknown; now, if that is earlier), so it
-- counts this window from when it can have been charged at the latest. Never early; late by less than an old bucket plus a new one.
-- What had rolled off under the old window stays off, and what is older than this window (it
-- shrank) is out of it. Indices of one width read as another would put a charge hours in the
-- past (lost) or in the future (never rolling off).
local function rebucket(L, old_width, old_life)
  local fields = redis.call('HGETALL', L.W)
  local now_k = math.floor(now / L.width)
  local old, moved, order, stale = {}, {}, {}, {}
  for i = 1, #fields, 2 do
    local f, v = fields[i], fields[i + 1]
    local kind = string.sub(f, 1, 1)
    if kind == 't' or kind == 'u' or kind == 'm' then
      table.insert(stale, f)
      local k = tonumber(string.sub(f, 2))
      local b = old[k]
      if not b then b = {0, {0, 0}, nil}; old[k] = b end
      if kind == 't' then b[1] = tonumber(v) elseif kind == 'u' then b[2] = P(v) else b[3] = tonumber(v) end
    end
  end
  for k, c in pairs(old) do
    local last = math.min(c[3] or ((k + 1) * old_width - 1), (k + 1) * old_width - 1, now)
    local to = math.min(math.floor(last / L.width), now_k)
    if now < (k + 1) * old_width + old_life and now < expires(L, to) and now < last + L.life then
      local b = moved[to]
      if not b then b = {0, {0, 0}, last}; moved[to] = b; table.insert(order, to) end
      b[1] = b[1] + c[1]
      b[2] = padd(b[2], c[2])
      b[3] = math.max(b[3], last)
    end
  end
  if #stale > 0 then redis.call('HDEL', L.W, unpack(stale)) end
  table.sort(order)
  local st, sp, f = 0, {0, 0}, {}
  for _, k in ipairs(order) do
    local b = moved[k]
    st = st + b[1]
    sp = padd(sp, b[2])
    table.insert(f, 't' .. istr(k)); table.insert(f, istr(b[1]))
    table.insert(f, 'u' .. istr(k)); table.insert(f, pstr(b[2]))
    table.insert(f, 'm' .. istr(k)); table.insert(f, istr(b[3]))
  end
  if #f > 0 then redis.call('HSET', L.W, unpack(f)) end
  L.buckets, L.order = moved, order
  return st, sp
end

-- One ledger as it is now: expired holds dropped (a crashed gateway's reservations end here),
-- buckets that rolled off subtracted from the running sums.
local function load(i)
  local L = {
    W = KEYS[3 * i + 1], R = KEYS[3 * i + 2], X = KEYS[3 * i + 3],
    width = tonumber(ARGV[7 + 4 * i]), life = tonumber(ARGV[8 + 4 * i]),
    cap_t = tonumber(ARGV[9 + 4 * i]), cap_p = nil,
  }
  if ARGV[10 + 4 * i] ~= '-1' then L.cap_p = P(ARGV[10 + 4 * i]) end
  local w = redis.call('HMGET', L.W, 'ht', 'hu', 'st', 'su', 'lo', 'bw', 'wl')
  L.held_t = tonumber(w[1] or '0')
  L.held_p = P(w[2] or nil)
  L.expired = redis.call('ZRANGEBYSCORE', L.X, '-inf', now)
  for _, rid in ipairs(L.expired) do
    local h = redis.call('HGET', L.R, rid)
    local sp = h and string.find(h, ' ')
    if sp then
      L.held_t = math.max(0, L.held_t - tonumber(string.sub(h, 1, sp - 1)))
      L.held_p = psub(L.held_p, P(string.sub(h, sp + 1)))
    end
    if h then redis.call('HDEL', L.R, rid) end
    redis.call('ZREM', L.X, rid)
  end
  -- Buckets up to `dead` have rolled off: (dead + 1) * width + window <= now.
  local dead = math.floor((now - L.life) / L.width) - 1
  local span = math.floor(L.life / L.width) + 2
  L.sums_dirty = false
  -- Written under this window, or (no `bw`: before windows were recorded) taken to be.
  local old_width, old_life = tonumber(w[6] or L.width), tonumber(w[7] or L.life)
  L.geom_dirty = old_width ~= L.width or old_life ~= L.life or not w[6]
  if old_width ~= L.width then
    L.spent_t, L.spent_p = rebucket(L, old_width, old_life)
    L.lo = math.max(dead + 1, 0)
    L.sums_dirty = true
  elseif w[5] then
    L.lo = tonumber(w[5])
    L.spent_t, L.spent_p = tonumber(w[3] or '0'), P(w[4] or nil)
    if dead >= L.lo then
      if dead - L.lo > span then
        L.spent_t, L.spent_p = scan(L)
      else
        for k = L.lo, dead do
          local b = redis.call('HMGET', L.W, 't' .. istr(k), 'u' .. istr(k))
          if b[1] then L.spent_t = math.max(0, L.spent_t - tonumber(b[1])) end
          if b[2] then L.spent_p = psub(L.spent_p, P(b[2])) end
          if b[1] or b[2] then
            redis.call('HDEL', L.W, 't' .. istr(k), 'u' .. istr(k), 'm' .. istr(k))
          end
        end
      end
      L.lo = dead + 1
      L.sums_dirty = true
    end
    -- Of the buckets left, only the oldest can have rolled off by its latest charge (the
    -- next one's charges all came after its end), and not before its start plus the window.
    if now >= L.lo * L.width + L.life then
      local k = istr(L.lo)
      local b = redis.call('HMGET', L.W, 't' .. k, 'u' .. k, 'm' .. k)
      if b[3] and now >= tonumber(b[3]) + L.life then
        if b[1] then L.spent_t = math.max(0, L.spent_t - tonumber(b[1])) end
        if b[2] then L.spent_p = psub(L.spent_p, P(b[2])) end
        redis.call('HDEL', L.W, 't' .. k, 'u' .. k, 'm' .. k)
        L.lo = L.lo + 1
        L.sums_dirty = true
      end
    end
  else
    -- Written before running sums (or never): one scan sets them up.
    L.spent_t, L.spent_p = scan(L)
    L.lo = math.max(dead + 1, 0)
    L.sums_dirty = true
  end
  return L
end

local function exists(L) return redis.call('EXISTS', L.W) == 1 end

-- Writes what `load` and the operation changed. `held_dirty`: a hold was taken or ended, and
-- `keep_keys` follows (the keys may be created here). Otherwise only where the ledger exists:
-- HSET keeps the key's expiry, and a refusal on a ledger never written must create nothing (a
-- key without expiry would never go).
local function save(L, held_dirty)
  if not held_dirty and not exists(L) then return end
  local f = {}
  if held_dirty or #L.expired > 0 then
    table.insert(f, 'ht'); table.insert(f, istr(L.held_t))
    table.insert(f, 'hu'); table.insert(f, pstr(L.held_p))
  end
  if L.sums_dirty then
    table.insert(f, 'st'); table.insert(f, istr(L.spent_t))
    table.insert(f, 'su'); table.insert(f, pstr(L.spent_p))
    table.insert(f, 'lo'); table.insert(f, istr(L.lo))
  end
  if L.geom_dirty then
    table.insert(f, 'bw'); table.insert(f, istr(L.width))
    table.insert(f, 'wl'); table.insert(f, istr(L.life))
  end
  if #f > 0 then redis.call('HSET', L.W, unpack(f)) end
  if L.geom_dirty then
    -- The keys' expiry was set for the old window: a longer one must not lose the ledger to
    -- it while every call is a refusal (which sets no expiry).
    outlive(L, L.life + L.width + 60000)
    L.geom_dirty = false
  end
end

local function fits(L, t, p)
  return (L.cap_t < 0 or t + amt_t <= L.cap_t) and (L.cap_p == nil or ple(padd(p, amt_p), L.cap_p))
end

local function keep_keys(L)
  -- Everything rolls off within a window plus a bucket after its charge, and holds within
  -- their ttl: an idle ledger then disappears from Redis by itself, having nothing left.
  local ms = L.life + L.width + math.max(ttl, 0) + 60000
  redis.call('PEXPIRE', L.W, ms)
  redis.call('PEXPIRE', L.R, ms)
  redis.call('PEXPIRE', L.X, ms)
end

-- Seconds until the request fits: Ledger::wait in the core, step for step. Holds end with
-- their requests and are not waited for: when what is spent alone admits the request, 1;
-- else until enough spending rolled off, at most the window.
local function wait_s(L)
  local cap_t, cap_p = L.cap_t, L.cap_p
  if not ((cap_t < 0 or amt_t <= cap_t) and (cap_p == nil or ple(amt_p, cap_p))) then
    return -1
  end
  local need_t = 0
  if cap_t >= 0 then need_t = math.max(0, L.spent_t + amt_t - cap_t) end
  local need_p = {0, 0}
  if cap_p then need_p = psub(padd(L.spent_p, amt_p), cap_p) end
  if need_t == 0 and pzero(need_p) then return 1 end
  if not L.order then scan(L) end
  local window_s = math.max(1, math.floor(L.life / 1000))
  local freed_t, freed_p = 0, {0, 0}
  for _, k in ipairs(L.order) do
    freed_t = freed_t + L.buckets[k][1]
    freed_p = padd(freed_p, L.buckets[k][2])
    if freed_t >= need_t and ple(need_p, freed_p) then
      local at = expires_m(L, k, L.buckets[k][3])
      return math.min(window_s, math.max(1, math.ceil((at - now) / 1000)))
    end
  end
  return 1
end

-- Every answer to a gateway carries a version that orders it after every earlier answer on
-- this ledger: gateways receive answers out of order (one worker's settle answered before
-- another's older one is processed) and keep the newest for their gauges. Scripts on one ledger
-- run one at a time, so a counter orders them; taking at least the clock in microseconds keeps
-- the order when the keys expired in between (an idle ledger disappears, and its counter with
-- it), and the counter keeps it when the clock steps back. Stored only where the ledger exists.
local function stamp(L)
  local v = math.max(tonumber(redis.call('HGET', L.W, 'v') or '0') + 1, now_us)
  if exists(L) then redis.call('HSET', L.W, 'v', istr(v)) end
  return v
end

local out = {}
local function answer(L, a, b, version)
  for _, x in ipairs({istr(a), istr(b), istr(L.spent_t), pstr(L.spent_p), istr(L.held_t),
      pstr(L.held_p), istr(version)}) do
    table.insert(out, x)
  end
end

-- Adds a charge to the bucket of now (charged at settle time: it rolls off no earlier than it
-- should), which now is the bucket's latest charge.
local function charge(L, charge_t, charge_p)
  if charge_t and (charge_t > 0 or not pzero(charge_p)) then
    local k = math.floor(now / L.width)
    redis.call('HINCRBY', L.W, 't' .. istr(k), istr(charge_t))
    local cur = redis.call('HMGET', L.W, 'u' .. istr(k), 'm' .. istr(k))
    local last = math.max(now, tonumber(cur[2] or '0'))
    redis.call('HSET', L.W, 'u' .. istr(k), pstr(padd(P(cur[1] or nil), charge_p)),
      'm' .. istr(k), istr(last))
    L.spent_t = L.spent_t + charge_t
    L.spent_p = padd(L.spent_p, charge_p)
    -- A charge below `lo` (the clock stepped back) must still roll off by the walk.
    if k < L.lo then L.lo = k end
    L.sums_dirty = true
  end
end

-- Drops the hold `id` on L (if there) and marks the id ended; `charge` the usage to add (or
-- nil). Returns 1 when the hold was found.
local function finish(L, charge_t, charge_p)
  local h = redis.call('HGET', L.R, id)
  local found = 0
  if h and h ~= '-' then
    found = 1
    local sp = string.find(h, ' ')
    L.held_t = math.max(0, L.held_t - tonumber(string.sub(h, 1, sp - 1)))
    L.held_p = psub(L.held_p, P(string.sub(h, sp + 1)))
  end
  redis.call('HSET', L.R, id, '-')
  redis.call('ZADD', L.X, now + ttl, id)
  charge(L, charge_t, charge_p)
  save(L, true)
  keep_keys(L)
  return found
end

-- After a reserve found only holds in its way while leases held room, leases stay at their
-- requests in flight for this long: their next reports give back the room they do not use, and
-- take none, so the request (which the service may retry for a while) and those after it are
-- admitted exactly while what is spent leaves room for them. Past it leases grow again.
local RECLAIM_MS = 1000

-- The ledger may have leases holding room (`lu`, set by the lease op).
local function leased(L)
  return tonumber(redis.call('HGET', L.W, 'lu') or '0') > now
end

-- A reserve refused by holds alone, with leases holding room: ask them to give it back.
local function reclaim(L)
  redis.call('HSET', L.W, 'rc', istr(now + RECLAIM_MS))
end

local n = math.floor(#KEYS / 3)
local ledgers = {}
for i = 0, n - 1 do ledgers[i + 1] = load(i) end

if op == 'reserve' or op == 'check' then
  -- All or nothing: the request is held on every ledger or on none.
  local refused = false
  for _, L in ipairs(ledgers) do
    L.prior = (op == 'reserve') and redis.call('HGET', L.R, id)
    if not L.prior and not fits(L, L.spent_t + L.held_t, padd(L.spent_p, L.held_p)) then
      L.refused = true
      refused = true
    end
  end
  for _, L in ipairs(ledgers) do
    if L.prior == '-' then
      save(L, false)
      answer(L, 2, 0, stamp(L))
    elseif L.prior then
      if refused then
        -- Held by an earlier send of this reserve, which is now refused: nothing may stay held.
        finish(L, nil, nil)
        answer(L, 3, 0, stamp(L))
      else
        save(L, false)
        answer(L, 1, 0, stamp(L))
      end
    elseif L.refused then
      local w = wait_s(L)
      local code = 0
      if op == 'reserve' and fits(L, L.spent_t, L.spent_p) and leased(L) then
        reclaim(L)
        code = 4
      end
      save(L, false)
      answer(L, code, w, stamp(L))
    elseif refused or op == 'check' then
      save(L, false)
      answer(L, refused and 3 or 1, 0, stamp(L))
    else
      L.held_t = L.held_t + amt_t
      L.held_p = padd(L.held_p, amt_p)
      redis.call('HSET', L.R, id, istr(amt_t) .. ' ' .. pstr(amt_p))
      redis.call('ZADD', L.X, now + ttl, id)
      -- The hold created the keys if they were gone: save writes the sums with them.
      L.sums_dirty = true
      save(L, true)
      keep_keys(L)
      answer(L, 1, 0, stamp(L))
    end
  end
  return out
elseif op == 'settle' or op == 'release' then
  for _, L in ipairs(ledgers) do
    local found
    if redis.call('HGET', L.R, id) == '-' then
      save(L, false)
      found = 0
    elseif op == 'settle' then
      found = finish(L, amt_t, amt_p)
    else
      found = finish(L, nil, nil)
    end
    answer(L, found, 0, stamp(L))
  end
  return out
elseif op == 'lease' then
  -- One ledger's lease (KEYS[4]: <ledger>:l, the live leases by expiry): the old lease `id`
  -- ('' for none) is dropped and its use charged, and a new hold taken under ARGV[11]:
  -- max(min(max, free / (2 x leaseholders)), admitted) per dimension (a dimension without a
  -- cap gets max), or only `admitted` while a reserve asked leases to give their room back
  -- (`rc`). ARGV[12..13] admitted tokens/pico, ARGV[14..15] max tokens/pico,
  -- ARGV[16] '1' = unheld (test-only: granted from all the free room, nothing held).
  -- Answer: the ledger's 7 strings (code 1 applied, 2 applied before: this report's answer
  -- was lost and it came again) and the granted tokens and pico.
  local L = ledgers[1]
  local LK = KEYS[4]
  local new_id = ARGV[11]
  local adm_t, adm_p = tonumber(ARGV[12]), P(ARGV[13])
  local max_t, max_p = tonumber(ARGV[14]), P(ARGV[15])
  local unheld = ARGV[16] == '1'
  redis.call('ZREMRANGEBYSCORE', LK, '-inf', now)
  local prior = redis.call('HGET', L.R, new_id)
  if prior then
    -- Held ("<tokens> <pico>"), or "-": it granted nothing, or its lease ended since.
    local sp = string.find(prior, ' ')
    save(L, false)
    answer(L, 2, 0, stamp(L))
    table.insert(out, sp and string.sub(prior, 1, sp - 1) or '0')
    table.insert(out, sp and string.sub(prior, sp + 1) or '0')
    return out
  end
  if id ~= '' then
    local h = redis.call('HGET', L.R, id)
    if h and h ~= '-' then
      local sp = string.find(h, ' ')
      L.held_t = math.max(0, L.held_t - tonumber(string.sub(h, 1, sp - 1)))
      L.held_p = psub(L.held_p, P(string.sub(h, sp + 1)))
      redis.call('HSET', L.R, id, '-')
      redis.call('ZADD', L.X, now + ttl, id)
    end
    redis.call('ZREM', LK, id)
  end
  charge(L, amt_t, amt_p)
  local share = 1
  if not unheld then share = 2 * (redis.call('ZCARD', LK) + 1) end
  local g_t = max_t
  if L.cap_t >= 0 then
    g_t = math.min(max_t, math.floor(math.max(0, L.cap_t - L.spent_t - L.held_t) / share))
  end
  if g_t < adm_t then g_t = adm_t end
  local g_p = max_p
  if L.cap_p then
    local free = psub(L.cap_p, padd(L.spent_p, L.held_p))
    local hi = math.floor(free[1] / share)
    local lo = math.floor(((free[1] - hi * share) * BASE + free[2]) / share)
    local chunk = {hi, lo}
    if ple(chunk, g_p) then g_p = chunk end
  end
  if ple(g_p, adm_p) then g_p = adm_p end
  if not unheld and tonumber(redis.call('HGET', L.W, 'rc') or '0') > now then
    -- Reclaiming: hold what is in flight on the lease, no room beside it.
    g_t, g_p = adm_t, adm_p
  end
  if not unheld and (g_t > 0 or not pzero(g_p)) then
    L.held_t = L.held_t + g_t
    L.held_p = padd(L.held_p, g_p)
    redis.call('HSET', L.R, new_id, istr(g_t) .. ' ' .. pstr(g_p))
    redis.call('ZADD', L.X, now + ttl, new_id)
    redis.call('ZADD', LK, now + ttl, new_id)
  elseif not unheld then
    -- Nothing granted: the id is still marked, so this report sent again is not applied twice.
    redis.call('HSET', L.R, new_id, '-')
    redis.call('ZADD', L.X, now + ttl, new_id)
  end
  L.sums_dirty = true
  save(L, true)
  -- Whether a lease may hold room here, for reserves refused by holds (`reclaim`).
  if redis.call('ZCARD', LK) > 0 then
    redis.call('HSET', L.W, 'lu', istr(now + ttl))
  else
    redis.call('HDEL', L.W, 'lu')
  end
  keep_keys(L)
  redis.call('PEXPIRE', LK, L.life + L.width + math.max(ttl, 0) + 60000)
  answer(L, 1, 0, stamp(L))
  table.insert(out, istr(g_t))
  table.insert(out, pstr(g_p))
  return out
elseif op == 'status' then
  for _, L in ipairs(ledgers) do
    save(L, false)
    answer(L, 0, 0, 0)
  end
  return out
end
return redis.error_reply('unknown op ' .. tostring(op))
