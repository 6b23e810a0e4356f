//! One value in the host's shared data, kept by every worker: the key scheme, the
//! compare-and-swap write loop and the per-worker copy refreshed on the root tick. What the bytes
//! mean is the value's codec (`router_core::shared_codec`).
//!
//! Each worker reads its copy on the request path, so routing makes no shared-data hostcall; a
//! write on another worker is seen within one refresh, one on this worker at once.

use crate::host::{set_shared_data, shared_data};
use crate::types::{HostError, HostResult, CAS_MISMATCH};
use router_core::shared_codec::{self, Codec, TooLarge};
use std::cell::{Cell, Ref, RefCell};

/// How often each worker re-reads its tables (the root tick period).
pub const REFRESH_MS: u32 = 100;
/// Writers racing on one value retry this often before giving up.
pub const CAS_ATTEMPTS: usize = 8;

/// Where a table's value lives: the host's shared data, or a stand-in in tests.
pub trait Store {
    /// The value and its compare-and-swap token; `None` when never written.
    fn get(&self, key: &str) -> HostResult<Option<(Vec<u8>, u32)>>;
    /// Writes if nobody wrote since `cas` was read (0: unconditionally).
    fn set(&self, key: &str, value: &[u8], cas: u32) -> HostResult<()>;
}

/// The host's shared data (one store for every worker's VM of this vm_id).
#[derive(Debug, Default, Clone, Copy)]
pub struct HostStore;

impl Store for HostStore {
    fn get(&self, key: &str) -> HostResult<Option<(Vec<u8>, u32)>> {
        shared_data(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: u32) -> HostResult<()> {
        set_shared_data(key, value, cas)
    }
}

/// Budget ledgers (`router_core::budget::shared`) run their own compare-and-swap loop over the
/// same shared data. A failed read is reported as absent, which that loop treats as a missing
/// ledger: the request is refused (fail closed), never given an empty ledger.
impl router_core::budget::shared::SharedData for HostStore {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        shared_data(key).ok().flatten()
    }
    fn set(
        &self,
        key: &str,
        value: &[u8],
        cas: Option<u32>,
    ) -> Result<(), router_core::budget::shared::SetError> {
        use router_core::budget::shared::SetError;
        match set_shared_data(key, value, cas.unwrap_or(0)) {
            Ok(()) => Ok(()),
            Err(e) if e.status == CAS_MISMATCH => Err(SetError::CasMismatch),
            Err(_) => Err(SetError::Host),
        }
    }
}

/// What an update did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Updated {
    /// The change left the value as it was; nothing written.
    Unchanged,
    Written,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableError {
    Host(HostError),
    /// Other writers won `CAS_ATTEMPTS` races in a row.
    Contended,
    TooLarge(TooLarge),
}

impl std::fmt::Display for TableError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TableError::Host(e) => e.fmt(f),
            TableError::Contended => f.write_str("too many concurrent writers"),
            TableError::TooLarge(e) => e.fmt(f),
        }
    }
}

pub struct SharedTable<C: Codec, S: Store = HostStore> {
    key: String,
    codec: C,
    store: S,
    copy: RefCell<C::Value>,
    /// The stored version (`cas`) the copy was last read from; unchanged versions are not
    /// decoded again.
    read: Cell<Option<u32>>,
}

impl<C: Codec> SharedTable<C> {
    /// Table `name` of router `router` in the host's shared data.
    pub fn new(name: &str, router: &str, codec: C) -> Self {
        SharedTable::with_store(name, router, codec, HostStore)
    }
}

impl<C: Codec, S: Store> SharedTable<C, S> {
    pub fn with_store(name: &str, router: &str, codec: C, store: S) -> Self {
        SharedTable {
            key: shared_codec::key(name, router),
            copy: RefCell::new(codec.empty()),
            read: Cell::new(None),
            codec,
            store,
        }
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    /// Re-reads the stored value into this worker's copy (root tick) when it is a version the
    /// copy was not read from; returns whether it was. A failed read keeps the copy as it was.
    pub fn refresh(&self) -> bool {
        match self.store.get(&self.key) {
            Ok(Some((raw, cas))) if self.read.get() != Some(cas) => {
                *self.copy.borrow_mut() = shared_codec::decode(&self.codec, &raw);
                self.read.set(Some(cas));
                true
            }
            _ => false,
        }
    }

    /// This worker's copy.
    pub fn local(&self) -> Ref<'_, C::Value> {
        self.copy.borrow()
    }

    /// Applies `change` to the stored value and writes it back unless someone wrote in between
    /// (then again, on their value). `change` returns whether it changed anything. This worker's
    /// copy is the stored value afterwards.
    pub fn update(&self, change: impl Fn(&mut C::Value) -> bool) -> Result<Updated, TableError> {
        for _ in 0..CAS_ATTEMPTS {
            let (mut value, cas) = match self.store.get(&self.key) {
                Ok(Some((raw, cas))) => (shared_codec::decode(&self.codec, &raw), cas),
                Ok(None) => (self.codec.empty(), 0),
                Err(e) => return Err(TableError::Host(e)),
            };
            if !change(&mut value) {
                *self.copy.borrow_mut() = value;
                return Ok(Updated::Unchanged);
            }
            let raw = shared_codec::encode(&self.codec, &value).map_err(TableError::TooLarge)?;
            match self.store.set(&self.key, &raw, cas) {
                Ok(()) => {
                    *self.copy.borrow_mut() = value;
                    return Ok(Updated::Written);
                }
                Err(e) if e.status == CAS_MISMATCH => continue,
                Err(e) => return Err(TableError::Host(e)),
            }
        }
        Err(TableError::Contended)
    }

    /// Changes only this worker's copy (until a refresh reads a newer stored version), e.g. when
    /// sharing failed.
    pub fn update_local(&self, change: impl FnOnce(&mut C::Value)) {
        change(&mut self.copy.borrow_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use router_core::quarantine::{Quarantine, QuarantineCodec};

    /// One key's value and CAS token; `races` writes by "another worker" land just before ours.
    #[derive(Default)]
    struct Fake {
        value: RefCell<Option<(Vec<u8>, u32)>>,
        races: Cell<usize>,
        fail: Cell<bool>,
    }

    impl Store for &Fake {
        fn get(&self, _: &str) -> HostResult<Option<(Vec<u8>, u32)>> {
            if self.fail.get() {
                return Err(HostError {
                    call: "get",
                    status: 2,
                });
            }
            Ok(self.value.borrow().clone())
        }
        fn set(&self, _: &str, value: &[u8], cas: u32) -> HostResult<()> {
            let (stored, current) = self.value.borrow().clone().unwrap_or_default();
            if self.races.get() > 0 {
                // Another worker rewrites what was there.
                self.races.set(self.races.get() - 1);
                *self.value.borrow_mut() = Some((stored, current + 1));
                return Err(HostError {
                    call: "set",
                    status: CAS_MISMATCH,
                });
            }
            if cas != 0 && cas != current {
                return Err(HostError {
                    call: "set",
                    status: CAS_MISMATCH,
                });
            }
            *self.value.borrow_mut() = Some((value.to_vec(), current + 1));
            Ok(())
        }
    }

    fn table(store: &Fake) -> SharedTable<QuarantineCodec, &Fake> {
        SharedTable::with_store("quarantine", "ns/r", QuarantineCodec { backends: 2 }, store)
    }

    #[test]
    fn updates_are_shared_and_seen_by_other_workers_on_refresh() {
        let store = Fake::default();
        let (mine, theirs) = (table(&store), table(&store));
        assert_eq!(mine.key(), "llmkube.quarantine/ns/r");
        assert_eq!(mine.update(|q| q.mark(1, 100)), Ok(Updated::Written));
        assert!(mine.local().is_quarantined(1, 99));
        assert!(
            !theirs.local().is_quarantined(1, 99),
            "not before a refresh"
        );
        assert!(theirs.refresh(), "a new version is read");
        assert!(theirs.local().is_quarantined(1, 99));
        assert!(!theirs.refresh(), "the same version is not read again");
        assert_eq!(theirs.update(|q| q.mark(1, 50)), Ok(Updated::Unchanged));
        assert_eq!(mine.update(|q| q.mark(0, 100)), Ok(Updated::Written));
        assert!(theirs.refresh(), "the next version is read");
        assert!(theirs.local().is_quarantined(0, 99));
    }

    #[test]
    fn a_lost_race_retries_on_the_winners_value() {
        let store = Fake::default();
        let t = table(&store);
        store.races.set(3);
        assert_eq!(t.update(|q| q.mark(0, 10)), Ok(Updated::Written));
        store.races.set(CAS_ATTEMPTS);
        assert_eq!(t.update(|q| q.mark(1, 10)), Err(TableError::Contended));
    }

    #[test]
    fn host_errors_come_back_and_local_changes_stay_local() {
        let store = Fake::default();
        let t = table(&store);
        store.fail.set(true);
        assert!(matches!(
            t.update(|q| q.mark(0, 10)),
            Err(TableError::Host(_))
        ));
        t.update_local(|q| {
            q.mark(0, 10);
        });
        assert!(t.local().is_quarantined(0, 5));
        t.refresh();
        assert!(
            t.local().is_quarantined(0, 5),
            "a failed read keeps the copy"
        );
        store.fail.set(false);
        t.refresh();
        assert!(
            t.local().is_quarantined(0, 5),
            "nothing stored: the copy stands"
        );
        table(&store).update(|q| q.mark(1, 10)).unwrap();
        t.refresh();
        let mut shared = Quarantine::new(2);
        shared.mark(1, 10);
        assert_eq!(*t.local(), shared, "the stored value replaces the copy");
    }
}
