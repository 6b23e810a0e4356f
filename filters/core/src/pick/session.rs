//! Which pod each session is on, keyed by a hash of its header value (the value is never kept).

use super::blocks::fnv64;

/// Default `sessionAffinity.idleTimeout`.
pub const DEFAULT_IDLE_NS: u64 = 30 * 60 * 1_000_000_000;

/// Most sessions remembered; beyond, the longest idle are forgotten first (they would be placed
/// by load again, which is what an expired session gets anyway).
pub const MAX_SESSIONS: usize = 65_536;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    pub pod: u16,
    pub last_ns: u64,
}

#[derive(Clone, Debug, Default)]
pub struct Sessions {
    map: hashbrown::HashMap<u64, Binding, fnv::FnvBuildHasher>,
    limit: usize,
}

/// The session key of a request: the first of `names` (in priority order, compared
/// case-insensitively) present with a non-empty value, hashed. `headers` are the request's.
pub fn session_key<'a>(
    names: &[String],
    headers: impl Iterator<Item = (&'a str, &'a str)> + Clone,
) -> Option<u64> {
    names.iter().find_map(|want| {
        headers
            .clone()
            .find(|(n, v)| n.eq_ignore_ascii_case(want) && !v.trim().is_empty())
            .map(|(_, v)| fnv64(v.trim().as_bytes()))
    })
}

impl Sessions {
    pub fn new(limit: usize) -> Self {
        Sessions {
            map: Default::default(),
            limit: limit.clamp(1, MAX_SESSIONS),
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The session's pod, unless it was idle longer than `idle_ns`.
    pub fn get(&self, key: u64, now: u64, idle_ns: u64) -> Option<u16> {
        self.map
            .get(&key)
            .filter(|b| now.saturating_sub(b.last_ns) <= idle_ns)
            .map(|b| b.pod)
    }

    pub fn bind(&mut self, key: u64, pod: u16, now: u64) {
        if self.map.len() >= self.limit && !self.map.contains_key(&key) {
            self.shed();
        }
        self.map.insert(key, Binding { pod, last_ns: now });
    }

    /// Drops the longest-idle eighth: amortised O(1) per new session.
    fn shed(&mut self) {
        let mut ages: Vec<u64> = self.map.values().map(|b| b.last_ns).collect();
        let k = (ages.len() / 8).max(1).min(ages.len() - 1);
        let (_, cut, _) = ages.select_nth_unstable(k);
        let cut = *cut;
        self.map.retain(|_, b| b.last_ns > cut);
        while self.map.len() >= self.limit {
            // Everyone equally old: drop arbitrary ones.
            let Some(&k) = self.map.keys().next() else {
                break;
            };
            self.map.remove(&k);
        }
    }

    /// Forgets sessions idle longer than `idle_ns`.
    pub fn expire(&mut self, now: u64, idle_ns: u64) {
        self.map
            .retain(|_, b| now.saturating_sub(b.last_ns) <= idle_ns);
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, Binding)> + '_ {
        self.map.iter().map(|(&k, &b)| (k, b))
    }

    pub fn limit(&self) -> usize {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_non_empty_configured_header_wins_case_insensitively() {
        let names = vec!["X-Session-Id".to_string(), "x-user".to_string()];
        let h = [
            ("x-user", "bob"),
            ("x-session-id", "  "),
            ("X-SESSION-ID", "s1"),
        ];
        let k = session_key(&names, h.iter().copied()).unwrap();
        assert_eq!(k, fnv64(b"s1"));
        let h = [("x-user", "bob"), ("x-session-id", "")];
        assert_eq!(session_key(&names, h.iter().copied()), Some(fnv64(b"bob")));
        let h = [("x-other", "bob")];
        assert_eq!(session_key(&names, h.iter().copied()), None);
    }

    #[test]
    fn idle_sessions_are_forgotten_and_the_table_is_bounded() {
        let mut s = Sessions::new(100);
        s.bind(1, 3, 1_000);
        assert_eq!(s.get(1, 1_500, 600), Some(3));
        assert_eq!(s.get(1, 1_700, 600), None);
        for k in 0..1_000u64 {
            s.bind(k + 10, (k % 4) as u16, 2_000 + k);
            assert!(s.len() <= 100);
        }
        // The newest survive.
        assert_eq!(s.get(1_009, 3_000, 10_000), Some(3));
        s.expire(3_100, 100);
        assert!(s.iter().all(|(_, b)| b.last_ns >= 3_000));
    }
}
