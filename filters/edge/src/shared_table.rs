//! One value in the host's shared data, kept by every worker: the key scheme, the
//! compare-and-swap write loop and the per-worker copy refreshed on the root tick. What the bytes
//! mean is the value's codec (`router_core::shared_codec`).
//!
//! Each worker reads its copy on the request path, so routing makes no shared-data hostcall; a
//! write on another worker is seen within one refresh, one on this worker at once.

use crate::host::{set_shared_data, shared_data};
use crate::types::CAS_MISMATCH;
use router_core::shared_codec::{self, Codec, TooLarge};
use router_core::shared_data::{
    compare_and_swap, CasError, ReadFailed, SetError, SharedData, Swap,
};
use std::cell::{Cell, Ref, RefCell};

/// How often each worker re-reads its tables (the root tick period).
pub const REFRESH_MS: u32 = 100;

/// The host's shared data (one store for every worker's VM of this vm_id), as the core's
/// [`SharedData`]: the budget ledgers and these tables write through one compare-and-swap loop
/// over it.
#[derive(Debug, Default, Clone, Copy)]
pub struct HostStore;

impl SharedData for HostStore {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, ReadFailed> {
        shared_data(key).map_err(|_| ReadFailed)
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SetError> {
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
    /// The host failed a read or write of shared data.
    Host,
    /// Other writers won `MAX_CAS_ATTEMPTS` races in a row.
    Contended,
    TooLarge(TooLarge),
}

impl std::fmt::Display for TableError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TableError::Host => f.write_str("the host failed a shared-data read or write"),
            TableError::Contended => f.write_str("too many concurrent writers"),
            TableError::TooLarge(e) => e.fmt(f),
        }
    }
}

pub struct SharedTable<C: Codec, S: SharedData = HostStore> {
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

impl<C: Codec, S: SharedData> SharedTable<C, S> {
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
        let (updated, value) = compare_and_swap(&self.store, &self.key, None, |raw| {
            let mut value = match raw {
                Some(raw) => shared_codec::decode(&self.codec, &raw),
                None => self.codec.empty(),
            };
            Ok(if change(&mut value) {
                let raw = shared_codec::encode(&self.codec, &value)?;
                Swap::Write(raw, (Updated::Written, value))
            } else {
                Swap::Keep((Updated::Unchanged, value))
            })
        })
        .map_err(|e| match e {
            CasError::Step(too_large) => TableError::TooLarge(too_large),
            CasError::Host => TableError::Host,
            CasError::Contended => TableError::Contended,
        })?;
        *self.copy.borrow_mut() = value;
        Ok(updated)
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

    impl SharedData for &Fake {
        fn get(&self, _: &str) -> Result<Option<(Vec<u8>, u32)>, ReadFailed> {
            if self.fail.get() {
                return Err(ReadFailed);
            }
            Ok(self.value.borrow().clone())
        }
        fn set(&self, _: &str, value: &[u8], cas: Option<u32>) -> Result<(), SetError> {
            let (stored, current) = self.value.borrow().clone().unwrap_or_default();
            if self.races.get() > 0 {
                // Another worker rewrites what was there.
                self.races.set(self.races.get() - 1);
                *self.value.borrow_mut() = Some((stored, current + 1));
                return Err(SetError::CasMismatch);
            }
            if cas.is_some_and(|cas| cas != current) {
                return Err(SetError::CasMismatch);
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
        store.races.set(router_core::shared_data::MAX_CAS_ATTEMPTS);
        assert_eq!(t.update(|q| q.mark(1, 10)), Err(TableError::Contended));
    }

    #[test]
    fn host_errors_come_back_and_local_changes_stay_local() {
        let store = Fake::default();
        let t = table(&store);
        store.fail.set(true);
        assert!(matches!(t.update(|q| q.mark(0, 10)), Err(TableError::Host)));
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
