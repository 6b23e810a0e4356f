-- The teams of one team budget that have a ledger in Redis, bounded like the gateway's own team
-- table: at most max_teams at a time. A team's ledger is keyed by its name, so this index never
-- decides where spend is kept; it decides which new teams are admitted, and lists them for
-- status.
--
-- KEYS[1] llmkube:{<router>|<budget>}:active  ZSET  team -> Redis time (ms) until which its
--         ledger may hold anything (its keys' expiry, refreshed by every call that writes it)
-- ARGV[1] op: admit (a reserve: a new team takes a place if one is free or quiet) |
--             touch (a settle or release: refreshes the team, never refused)
-- ARGV[2] team, ARGV[3] keep ms (how long the ledger's keys live after this call, plus a
-- margin), ARGV[4] max teams, ARGV[5] now ms or -1 for Redis TIME
--
-- Answer: {1, 0} admitted, or {0, ms until the quietest team's ledger has rolled off}.

local K, team = KEYS[1], ARGV[2]
local keep, max = tonumber(ARGV[3]), tonumber(ARGV[4])
local now = tonumber(ARGV[5])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local till = now + keep

local function place()
  -- GT: a team's time only moves later (calls answered out of order cannot shorten it).
  redis.call('ZADD', K, 'GT', till, team)
  local left = redis.call('PTTL', K)
  if left < keep then redis.call('PEXPIRE', K, keep) end
  return {1, 0}
end

if ARGV[1] == 'touch' or redis.call('ZSCORE', K, team) then return place() end
if redis.call('ZCARD', K) >= max then
  -- A team whose ledger has fully rolled off (its keys are gone) gives up its place: nothing
  -- of its spend is forgotten, there is none left.
  local quiet = redis.call('ZRANGEBYSCORE', K, '-inf', now, 'LIMIT', 0, 1)
  if #quiet == 0 then
    local first = redis.call('ZRANGE', K, 0, 0, 'WITHSCORES')
    return {0, math.max(1, tonumber(first[2]) - now)}
  end
  redis.call('ZREM', K, quiet[1])
end
return place()
