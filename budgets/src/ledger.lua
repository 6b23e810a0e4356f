-- One budget ledger in Redis, updated atomically by one script call. The same semantics as the
-- gateway core's `budget::ledger` (bucketed window that expires late never early, holds that
-- expire after their time-to-live, Retry-After to the second), checked against the same table of
-- cases (budgets/tests/cases.json).
--
-- KEYS[1] <ledger>:w  HASH  t<bucket> = tokens, u<bucket> = pico-USD spent in that bucket;
--                           ht, hu = tokens and pico-USD held by reservations;
--                           v = the version of the last answer (see `stamp`)
-- KEYS[2] <ledger>:r  HASH  reservation id -> "<tokens> <pico>", or "-" once it ended
-- KEYS[3] <ledger>:x  ZSET  reservation id scored by its expiry (ms)
--
-- Reservation ids are chosen by the gateway, so a release can be sent for a reservation whose
-- answer never came back (the client left). An ended id stays as a tombstone ("-") for the
-- hold ttl: a reserve arriving after its release holds nothing, and a settle repeated (a retry
-- whose first answer was lost) charges once.
-- ARGV[1] op: reserve | check | settle | release | status
-- ARGV[2] now in ms, or -1 for Redis server TIME (the one clock every gateway shares)
-- ARGV[3] bucket width ms, ARGV[4] window ms
-- ARGV[5] reservation id, ARGV[6] tokens, ARGV[7] pico (decimal string)
-- ARGV[8] hold ttl ms, ARGV[9] token cap or -1, ARGV[10] pico cap or -1
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
local width, life = tonumber(ARGV[3]), tonumber(ARGV[4])
local id = ARGV[5]
local amt_t, amt_p = tonumber(ARGV[6] or '0'), P(ARGV[7])
local ttl = tonumber(ARGV[8] or '0')
local cap_t = tonumber(ARGV[9] or '-1')
local cap_p = nil
if ARGV[10] and ARGV[10] ~= '-1' then cap_p = P(ARGV[10]) end

local W, R, X = KEYS[1], KEYS[2], KEYS[3]

-- Holds past their expiry go first: a crashed gateway's reservations end here.
local held_t = tonumber(redis.call('HGET', W, 'ht') or '0')
local held_p = P(redis.call('HGET', W, 'hu'))
local expired = redis.call('ZRANGEBYSCORE', X, '-inf', now)
for _, rid in ipairs(expired) do
  local h = redis.call('HGET', R, rid)
  local sp = h and string.find(h, ' ')
  if sp then
    held_t = math.max(0, held_t - tonumber(string.sub(h, 1, sp - 1)))
    held_p = psub(held_p, P(string.sub(h, sp + 1)))
  end
  if h then redis.call('HDEL', R, rid) end
  redis.call('ZREM', X, rid)
end

-- The live buckets, oldest first; dead ones are deleted.
local function expires(k) return (k + 1) * width + life end
local buckets, order = {}, {}
local fields = redis.call('HGETALL', W)
for i = 1, #fields, 2 do
  local f, v = fields[i], fields[i + 1]
  local kind = string.sub(f, 1, 1)
  if kind == 't' or kind == 'u' then
    local k = tonumber(string.sub(f, 2))
    if now >= expires(k) then
      redis.call('HDEL', W, f)
    else
      local b = buckets[k]
      if not b then b = {0, {0, 0}}; buckets[k] = b; table.insert(order, k) end
      if kind == 't' then b[1] = tonumber(v) else b[2] = P(v) end
    end
  end
end
table.sort(order)
local spent_t, spent_p = 0, {0, 0}
for _, k in ipairs(order) do
  spent_t = spent_t + buckets[k][1]
  spent_p = padd(spent_p, buckets[k][2])
end

local function fits(t, p)
  return (cap_t < 0 or t + amt_t <= cap_t) and (cap_p == nil or ple(padd(p, amt_p), cap_p))
end

local function keep_keys()
  -- Everything rolls off within a window plus a bucket after its charge, and holds within
  -- their ttl: an idle ledger then disappears from Redis by itself, having nothing left.
  local ms = life + width + math.max(ttl, 0) + 60000
  redis.call('PEXPIRE', W, ms)
  redis.call('PEXPIRE', R, ms)
  redis.call('PEXPIRE', X, ms)
end

local function save_held()
  redis.call('HSET', W, 'ht', istr(held_t), 'hu', pstr(held_p))
end

-- Seconds until the request fits: Ledger::wait in the core, step for step.
local function wait_s()
  if not ((cap_t < 0 or amt_t <= cap_t) and (cap_p == nil or ple(amt_p, cap_p))) then
    return -1
  end
  if not fits(held_t, held_p) then return 1 end
  local need_t = 0
  if cap_t >= 0 then need_t = math.max(0, spent_t + held_t + amt_t - cap_t) end
  local need_p = {0, 0}
  if cap_p then need_p = psub(padd(padd(spent_p, held_p), amt_p), cap_p) end
  if need_t == 0 and need_p[1] == 0 and need_p[2] == 0 then return 1 end
  local freed_t, freed_p = 0, {0, 0}
  for _, k in ipairs(order) do
    freed_t = freed_t + buckets[k][1]
    freed_p = padd(freed_p, buckets[k][2])
    if freed_t >= need_t and ple(need_p, freed_p) then
      return math.max(1, math.ceil((expires(k) - now) / 1000))
    end
  end
  return 1
end

-- Every answer to a gateway carries a version that orders it after every earlier answer on
-- this ledger: gateways receive answers out of order (one worker's settle answered before
-- another's older one is processed) and keep the newest for their gauges. Scripts on one ledger
-- run one at a time, so a counter orders them; taking at least the clock in microseconds keeps
-- the order when the keys expired in between (an idle ledger disappears, and its counter with
-- it), and the counter keeps it when the clock steps back. Stored only where the ledger exists
-- (HSET keeps the key's expiry; a refusal on a ledger never written creates nothing).
local function stamp()
  local v = math.max(tonumber(redis.call('HGET', W, 'v') or '0') + 1, now_us)
  if redis.call('EXISTS', W) == 1 then redis.call('HSET', W, 'v', istr(v)) end
  return v
end

-- Every answer carries the ledger as it is after the operation (the gateway's gauges).
local function answer(a, b)
  return {a, b, istr(spent_t), pstr(spent_p), istr(held_t), pstr(held_p), istr(stamp())}
end

if op == 'reserve' or op == 'check' then
  if #expired > 0 then save_held() end
  local prior = (op == 'reserve') and redis.call('HGET', R, id)
  if prior == '-' then return answer(2, 0) end
  if prior then return answer(1, 0) end
  if not fits(spent_t + held_t, padd(spent_p, held_p)) then
    return answer(0, wait_s())
  end
  if op == 'reserve' then
    held_t = held_t + amt_t
    held_p = padd(held_p, amt_p)
    save_held()
    redis.call('HSET', R, id, istr(amt_t) .. ' ' .. pstr(amt_p))
    redis.call('ZADD', X, now + ttl, id)
    keep_keys()
  end
  return answer(1, 0)
elseif op == 'settle' or op == 'release' then
  local h = redis.call('HGET', R, id)
  if h == '-' then
    if #expired > 0 then save_held() end
    return answer(0, 1)
  end
  local found = 0
  if h then
    found = 1
    local sp = string.find(h, ' ')
    held_t = math.max(0, held_t - tonumber(string.sub(h, 1, sp - 1)))
    held_p = psub(held_p, P(string.sub(h, sp + 1)))
  end
  redis.call('HSET', R, id, '-')
  redis.call('ZADD', X, now + ttl, id)
  save_held()
  if op == 'settle' and (amt_t > 0 or amt_p[1] > 0 or amt_p[2] > 0) then
    -- Charged at settle time: it rolls off no earlier than it should.
    local k = math.floor(now / width)
    redis.call('HINCRBY', W, 't' .. istr(k), istr(amt_t))
    local cur = P(redis.call('HGET', W, 'u' .. istr(k)))
    redis.call('HSET', W, 'u' .. istr(k), pstr(padd(cur, amt_p)))
    spent_t = spent_t + amt_t
    spent_p = padd(spent_p, amt_p)
  end
  keep_keys()
  return answer(found, 0)
elseif op == 'status' then
  if #expired > 0 then save_held() end
  return {istr(spent_t), pstr(spent_p), istr(held_t), pstr(held_p)}
end
return redis.error_reply('unknown op ' .. tostring(op))
