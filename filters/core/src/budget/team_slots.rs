//! The directory of team ledgers of one team budget, for proxy-wasm shared data.
//!
//! Shared data cannot forget a key, so team ledgers live in a fixed number of numbered slots and
//! this table says which team owns which slot and until when that team's ledger may still hold
//! anything (`quiet_until`: a safe upper bound, pushed forward on every admission by
//! [`TeamTable::quiet_bound`]). A slot is handed to a new team only when its old team's ledger has
//! fully rolled off, so eviction never forgets spending; when every slot is still busy a new team
//! is refused ([`TableError::Full`]) and the filter answers with a clear error and counts it.
//!
//! Protocol for a filter (each step a compare-and-swap): update the table first, then the slot's
//! ledger; a new or reused slot starts from an empty ledger. A late settle checks the slot still
//! belongs to its team ([`TeamTable::slot_of`]) before charging it.

use super::ledger::Shape;
use super::varint::put;

fn get(b: &[u8], i: &mut usize) -> Result<u64, TableError> {
    super::varint::get(b, i).ok_or(TableError::Corrupt)
}

pub use crate::config::budgets::DEFAULT_MAX_TEAMS;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableError {
    /// Every slot belongs to a team whose ledger may still hold spending.
    Full {
        max: usize,
    },
    Corrupt,
}

/// Where a team's ledger lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub index: usize,
    /// The slot was empty or taken over from a quiet team: its ledger must start empty.
    pub fresh: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TeamTable {
    /// Slot index = position. An evicted team's position is reused by the next new team.
    entries: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    team: String,
    quiet_until: u64,
}

impl TeamTable {
    /// Latest time anything admitted at `now` can still count: its hold lives at most the TTL
    /// plus a bucket, and a charge made before that rolls off at most a window plus a bucket later.
    pub fn quiet_bound(shape: &Shape, now_ms: u64) -> u64 {
        now_ms
            .saturating_add(shape.hold.lifetime_ms + shape.hold.width_ms)
            .saturating_add(shape.window.lifetime_ms + shape.window.width_ms)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn slot_of(&self, team: &str) -> Option<usize> {
        self.entries.iter().position(|e| e.team == team)
    }

    /// The teams with a slot, in slot order (for status).
    pub fn teams(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.team.as_str())
    }

    /// Gives `team` a slot busy until at least `until_ms`: its own, a free one, or one whose team
    /// has gone quiet by `now_ms`.
    pub fn admit(
        &mut self,
        team: &str,
        until_ms: u64,
        now_ms: u64,
        max: usize,
    ) -> Result<Slot, TableError> {
        if let Some(i) = self.slot_of(team) {
            let e = &mut self.entries[i];
            e.quiet_until = e.quiet_until.max(until_ms);
            return Ok(Slot {
                index: i,
                fresh: false,
            });
        }
        let entry = Entry {
            team: team.to_string(),
            quiet_until: until_ms,
        };
        if self.entries.len() < max {
            self.entries.push(entry);
            return Ok(Slot {
                index: self.entries.len() - 1,
                fresh: true,
            });
        }
        match self.entries.iter().position(|e| e.quiet_until <= now_ms) {
            Some(i) => {
                self.entries[i] = entry;
                Ok(Slot {
                    index: i,
                    fresh: true,
                })
            }
            None => Err(TableError::Full { max }),
        }
    }

    /// Keeps every slot its team's at least until `quiet_at(slot)` (when that slot's ledger,
    /// read under the budget's current window, holds nothing any more) where that is later
    /// than both `now_ms` and what the table says. The table's times were computed under the
    /// window in force when they were written: after the window grew (a configuration change)
    /// a slot would otherwise go to another team while its ledger still counts the old team's
    /// spend, which the new team would be charged and the old one would no longer be.
    /// Whether anything changed.
    pub fn outlast(&mut self, now_ms: u64, mut quiet_at: impl FnMut(usize) -> Option<u64>) -> bool {
        let mut changed = false;
        for (i, e) in self.entries.iter_mut().enumerate() {
            if let Some(q) = quiet_at(i).filter(|&q| q > now_ms && q > e.quiet_until) {
                e.quiet_until = q;
                changed = true;
            }
        }
        changed
    }

    /// When the first slot frees up (its team goes quiet): the `Retry-After` of a new team
    /// refused by a full table.
    pub fn next_free_at(&self) -> Option<u64> {
        self.entries.iter().map(|e| e.quiet_until).min()
    }

    /// Count, then per slot: team length, team bytes, `quiet_until`, as LEB128 varints.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put(out, self.entries.len() as u64);
        for e in &self.entries {
            put(out, e.team.len() as u64);
            out.extend_from_slice(e.team.as_bytes());
            put(out, e.quiet_until);
        }
    }

    /// Reads what [`TeamTable::encode`] wrote; at most `max` slots and team keys of at most
    /// [`super::admit::MAX_TEAM_KEY`] + 1 bytes are accepted, so a bad value cannot make it allocate.
    pub fn decode(b: &[u8], max: usize) -> Result<TeamTable, TableError> {
        let mut i = 0;
        let n = get(b, &mut i)?;
        if n > max as u64 {
            return Err(TableError::Corrupt);
        }
        let mut entries = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let len = get(b, &mut i)? as usize;
            if len > super::admit::MAX_TEAM_KEY + 1 || b.len() - i < len {
                return Err(TableError::Corrupt);
            }
            let team = std::str::from_utf8(&b[i..i + len])
                .map_err(|_| TableError::Corrupt)?
                .to_string();
            i += len;
            let quiet_until = get(b, &mut i)?;
            entries.push(Entry { team, quiet_until });
        }
        if i != b.len() {
            return Err(TableError::Corrupt);
        }
        Ok(TeamTable { entries })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_table_evicts_only_quiet_teams_and_else_refuses() {
        let shape = Shape::new(60, 900);
        let mut t = TeamTable::default();
        let until = TeamTable::quiet_bound(&shape, 0);
        assert_eq!(until, 900_000 + 113_000 + 60_000 + 1_000);
        assert_eq!(
            t.admit("a", until, 0, 2),
            Ok(Slot {
                index: 0,
                fresh: true
            })
        );
        assert_eq!(
            t.admit("b", 5_000, 0, 2),
            Ok(Slot {
                index: 1,
                fresh: true
            })
        );
        assert_eq!(
            t.admit("a", 10, 0, 2),
            Ok(Slot {
                index: 0,
                fresh: false
            })
        );
        // Full, nobody quiet yet.
        assert_eq!(
            t.admit("c", 9_000, 4_999, 2),
            Err(TableError::Full { max: 2 })
        );
        assert_eq!(t.next_free_at(), Some(5_000));
        // b went quiet at 5 s: c takes its slot, starting fresh; a keeps its own.
        assert_eq!(
            t.admit("c", 9_000, 5_000, 2),
            Ok(Slot {
                index: 1,
                fresh: true
            })
        );
        assert_eq!(t.slot_of("b"), None);
        assert_eq!(t.slot_of("a"), Some(0));
        assert_eq!(t.teams().collect::<Vec<_>>(), vec!["a", "c"]);
    }

    /// A team budget's window grew from 60 s to an hour: the slot of a team that spent under
    /// the old window stays its team's until its ledger is quiet under the new one.
    #[test]
    fn a_longer_window_keeps_a_slot_until_its_ledger_is_quiet() {
        use super::super::ledger::Ledger;
        use super::super::window::Amount;
        let old = Shape::new(60, 900);
        let mut t = TeamTable::default();
        let t0 = 1_000_000;
        t.admit("a", TeamTable::quiet_bound(&old, t0), t0, 1)
            .unwrap();
        let mut ledger = Ledger::new(&old);
        ledger.settle(&old, None, Amount::new(40, 0), t0);
        // The new configuration arrives 30 s later, while the charge still counts.
        let new = Shape::new(3600, 900);
        let now = t0 + 30_000;
        let bound = TeamTable::quiet_bound(&old, t0);
        // By the old window's bound another team could take the slot at `bound`.
        assert!(t.clone().admit("b", bound, bound, 1).is_ok());
        let l = Ledger::decode(ledger.as_bytes(), &new, now).unwrap();
        assert!(t.outlast(now, |_| Some(l.quiet_at(&new, now))));
        assert_eq!(
            t.admit("b", bound, bound, 1),
            Err(TableError::Full { max: 1 })
        );
        // Charged at 1000 s: gone at 1000 s + 3600 s.
        assert_eq!(t.next_free_at(), Some(4_600_000));
        assert!(t.admit("b", 4_600_000, 4_600_000, 1).is_ok());
        // Quiet ledgers change nothing.
        let mut t = TeamTable::default();
        t.admit("a", 5, 0, 1).unwrap();
        assert!(!t.outlast(10, |_| Some(10)));
    }

    #[test]
    fn codec_round_trips_and_refuses_garbage() {
        let mut t = TeamTable::default();
        for i in 0..50u64 {
            t.admit(&format!("team-{i}"), i * 1_000_000_007, 0, 100)
                .unwrap();
        }
        let mut b = Vec::new();
        t.encode(&mut b);
        assert_eq!(TeamTable::decode(&b, 100), Ok(t.clone()));
        assert_eq!(TeamTable::decode(&b, 49), Err(TableError::Corrupt));
        for cut in 0..b.len() {
            assert!(TeamTable::decode(&b[..cut], 100).is_err());
        }
        assert_eq!(TeamTable::decode(&[], 1), Err(TableError::Corrupt));
        assert_eq!(TeamTable::decode(&[0], 1), Ok(TeamTable::default()));
        assert!(TeamTable::decode(&[1, 0xff, 0xff, 0xff, 0x7f], 1).is_err());
    }
}
