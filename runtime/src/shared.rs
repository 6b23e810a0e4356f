//! Process-wide state Envoy shares between worker VMs: shared data (with CAS) and shared queues.
//!
//! It lives behind an `Arc<Mutex<..>>` so every VM of a plugin (Envoy's workers; the instances of
//! an ext_proc server's pool) sees one store, with Envoy's CAS rules across all of them. Sizes are
//! bounded: a guest asking for more gets a status code, never more memory.

use crate::types::Status;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

/// Keys one store holds, across vm_ids.
pub const MAX_SHARED_KEYS: usize = 1 << 16;
/// Bytes of one shared-data value.
pub const MAX_SHARED_VALUE: usize = 1 << 20;
/// Queues one store holds.
pub const MAX_QUEUES: usize = 1024;
/// Items waiting in one queue.
pub const MAX_QUEUE_ITEMS: usize = 4096;

/// A handle on one shared-data/queue store; clones share the same store.
#[derive(Clone, Default)]
pub struct SharedStore(Arc<Mutex<SharedInner>>, Arc<Mutex<Option<GetHook>>>);

/// Runs after a guest's `proxy_get_shared_data` read (outside the store lock), so a test can
/// make another worker write between a guest's read and its write.
pub type GetHook = Arc<dyn Fn(&str) + Send + Sync>;

struct SharedInner {
    /// (vm_id, key) -> (value, cas). Envoy scopes shared data by vm_id.
    data: HashMap<(String, String), (Vec<u8>, u32)>,
    /// Envoy hands out CAS values from one global counter that skips 0 (0 means "no CAS").
    next_cas: u32,
    queues: Vec<Queue>,
}

impl Default for SharedInner {
    fn default() -> Self {
        SharedInner {
            data: HashMap::new(),
            next_cas: 1,
            queues: Vec::new(),
        }
    }
}

pub(crate) struct Queue {
    pub vm_id: String,
    pub name: String,
    /// Which Host owns the queue (gets `on_queue_ready`), and its root context.
    pub owner: u64,
    pub root_context: u32,
    pub items: VecDeque<Vec<u8>>,
    /// Envoy posts one `on_queue_ready` per enqueue.
    pub pending_notifications: u32,
}

impl SharedInner {
    fn next_cas(&mut self) -> u32 {
        let cas = self.next_cas;
        self.next_cas = self.next_cas.wrapping_add(1);
        if self.next_cas == 0 {
            self.next_cas = 1;
        }
        cas
    }
}

impl SharedStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, SharedInner> {
        // A test that panicked while holding the lock must not poison every later assertion.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_get_hook(&self, hook: Option<GetHook>) {
        *self.1.lock().unwrap_or_else(|e| e.into_inner()) = hook;
    }

    pub(crate) fn guest_get(&self, vm_id: &str, key: &str) -> Option<(Vec<u8>, u32)> {
        let v = self.get(vm_id, key);
        let hook = self.1.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(hook) = hook {
            hook(key);
        }
        v
    }

    /// Enqueue by name as another VM would (after `resolve_shared_queue`).
    pub fn enqueue_named(&self, vm_id: &str, name: &str, value: &[u8]) -> Result<(), Status> {
        let id = self.resolve_queue(vm_id, name).ok_or(Status::NotFound)?;
        self.enqueue(id, value)
    }

    /// Value and CAS of a key, as `proxy_get_shared_data` would see it from `vm_id`.
    pub fn get(&self, vm_id: &str, key: &str) -> Option<(Vec<u8>, u32)> {
        self.lock()
            .data
            .get(&(vm_id.to_string(), key.to_string()))
            .cloned()
    }

    /// Envoy's exact rules: cas 0 always writes; a mismatching cas on an existing key fails;
    /// a key that does not exist yet is created whatever cas says; every write gets a new cas.
    /// Beyond [`MAX_SHARED_VALUE`] or [`MAX_SHARED_KEYS`] the write fails with InternalFailure.
    pub fn set(&self, vm_id: &str, key: &str, value: &[u8], cas: u32) -> Result<(), Status> {
        if value.len() > MAX_SHARED_VALUE {
            return Err(Status::InternalFailure);
        }
        let mut inner = self.lock();
        let k = (vm_id.to_string(), key.to_string());
        match inner.data.get(&k) {
            Some((_, current)) if cas != 0 && cas != *current => return Err(Status::CasMismatch),
            None if inner.data.len() >= MAX_SHARED_KEYS => return Err(Status::InternalFailure),
            _ => {}
        }
        let new_cas = inner.next_cas();
        inner.data.insert(k, (value.to_vec(), new_cas));
        Ok(())
    }

    /// All keys of one vm_id, for assertions.
    pub fn keys(&self, vm_id: &str) -> Vec<String> {
        let mut keys: Vec<String> = self
            .lock()
            .data
            .keys()
            .filter(|(v, _)| v == vm_id)
            .map(|(_, k)| k.clone())
            .collect();
        keys.sort();
        keys
    }

    pub(crate) fn register_queue(
        &self,
        vm_id: &str,
        name: &str,
        owner: u64,
        root: u32,
    ) -> Result<u32, Status> {
        let mut inner = self.lock();
        if let Some(i) = inner
            .queues
            .iter()
            .position(|q| q.vm_id == vm_id && q.name == name)
        {
            // Re-registering moves delivery to the new registrant, as Envoy does.
            inner.queues[i].owner = owner;
            inner.queues[i].root_context = root;
            return Ok(i as u32 + 1);
        }
        if inner.queues.len() >= MAX_QUEUES {
            return Err(Status::InternalFailure);
        }
        inner.queues.push(Queue {
            vm_id: vm_id.to_string(),
            name: name.to_string(),
            owner,
            root_context: root,
            items: VecDeque::new(),
            pending_notifications: 0,
        });
        Ok(inner.queues.len() as u32)
    }

    pub(crate) fn resolve_queue(&self, vm_id: &str, name: &str) -> Option<u32> {
        self.lock()
            .queues
            .iter()
            .position(|q| q.vm_id == vm_id && q.name == name)
            .map(|i| i as u32 + 1)
    }

    pub(crate) fn enqueue(&self, id: u32, value: &[u8]) -> Result<(), Status> {
        let mut inner = self.lock();
        let q = inner
            .queues
            .get_mut((id as usize).wrapping_sub(1))
            .ok_or(Status::NotFound)?;
        if q.items.len() >= MAX_QUEUE_ITEMS || value.len() > MAX_SHARED_VALUE {
            return Err(Status::InternalFailure);
        }
        q.items.push_back(value.to_vec());
        q.pending_notifications += 1;
        Ok(())
    }

    pub(crate) fn dequeue(&self, id: u32) -> Result<Vec<u8>, Status> {
        let mut inner = self.lock();
        let q = inner
            .queues
            .get_mut((id as usize).wrapping_sub(1))
            .ok_or(Status::NotFound)?;
        q.items.pop_front().ok_or(Status::Empty)
    }

    /// Takes one pending `on_queue_ready` notification for a queue owned by `owner`.
    pub(crate) fn take_notification(&self, owner: u64) -> Option<(u32, u32)> {
        let mut inner = self.lock();
        for (i, q) in inner.queues.iter_mut().enumerate() {
            if q.owner == owner && q.pending_notifications > 0 {
                q.pending_notifications -= 1;
                return Some((q.root_context, i as u32 + 1));
            }
        }
        None
    }

    /// Items waiting in a queue, for assertions.
    pub fn queue_len(&self, vm_id: &str, name: &str) -> Option<usize> {
        self.lock()
            .queues
            .iter()
            .find(|q| q.vm_id == vm_id && q.name == name)
            .map(|q| q.items.len())
    }
}
