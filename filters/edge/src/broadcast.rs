//! Messages from one worker to every other worker of the same VM id, through the host's shared
//! queues: each worker registers a queue of its own and lists its name in a shared-data value;
//! a sender enqueues a copy on every listed queue but its own; each worker drains its queue
//! when it needs the news (before a decision) and on the root tick (so a queue of an idle
//! worker stays short).
//!
//! A worker that joins says so on every queue already listed (a [`HELLO`]), and a worker that
//! drains one re-reads the list at once: the first worker to join would otherwise learn of the
//! later ones only on its next root tick, and what it did before that (at startup, the first
//! requests) would never reach them.
//!
//! Delivery is best-effort: a message to a queue that is gone is dropped, and the receiver's
//! state must tolerate that (the pick step's loads expire by lease).

use crate::abi::*;
use crate::host::shared_data;
use crate::shared_table::HostStore;
use crate::types::{check, take, HostError, HostResult, CAS_MISMATCH, INTERNAL_FAILURE, OK};
use router_core::shared_data::{compare_and_swap, CasError, Swap};
use std::cell::RefCell;
use std::convert::Infallible;

/// Most members listed; a newer worker replaces the oldest (a VM that was reloaded leaves its
/// name behind, and the list must not grow with every reload).
pub const MAX_MEMBERS: usize = 64;
/// Most messages one drain takes, so one callback's work stays bounded.
pub const MAX_DRAIN: usize = 4096;
/// "A member joined: re-read the list." Starts with a zero byte, which no channel's messages
/// start with (the pick events start with their magic), and never reaches the receiver's `f`.
pub const HELLO: &[u8] = b"\0llmkube-join";

pub struct Broadcast {
    key: String,
    own: String,
    own_id: u32,
    vm_id: String,
    /// Other members' names and queue ids, as last resolved.
    peers: RefCell<Vec<(String, u32)>>,
}

/// `list` with `name` added at the end, at most [`MAX_MEMBERS`] names (the oldest dropped).
pub fn with_member(list: &[u8], name: &str) -> Vec<u8> {
    let mut names: Vec<&[u8]> = list
        .split(|&b| b == b'\n')
        .filter(|n| !n.is_empty() && *n != name.as_bytes())
        .collect();
    names.push(name.as_bytes());
    let skip = names.len().saturating_sub(MAX_MEMBERS);
    names[skip..].join(&b'\n')
}

impl Broadcast {
    /// Joins channel `channel` of router `router`: registers this worker's queue (named with
    /// `nonce`, e.g. a random number) and lists it for the others. `vm_id` is the VM id the
    /// queues are registered under (the `plugin_vm_id` property).
    pub fn join(channel: &str, router: &str, vm_id: &str, nonce: u64) -> HostResult<Broadcast> {
        let key = router_core::shared_codec::key(channel, router);
        let own = format!("{key}/{nonce:016x}");
        let mut own_id = 0u32;
        check("proxy_register_shared_queue", unsafe {
            proxy_register_shared_queue(own.as_ptr(), own.len(), &mut own_id)
        })?;
        compare_and_swap(&HostStore, &key, None, |list| {
            let list = with_member(&list.unwrap_or_default(), &own);
            Ok::<_, Infallible>(Swap::Write(list, ()))
        })
        .map_err(|e| HostError {
            call: "proxy_set_shared_data",
            status: match e {
                CasError::Contended => CAS_MISMATCH,
                _ => INTERNAL_FAILURE,
            },
        })?;
        let b = Broadcast {
            key,
            own,
            own_id,
            vm_id: vm_id.to_string(),
            peers: RefCell::new(Vec::new()),
        };
        b.refresh();
        b.send(HELLO);
        Ok(b)
    }

    /// Re-reads the member list and resolves members not seen before (root tick).
    pub fn refresh(&self) {
        let Ok(Some((list, _))) = shared_data(&self.key) else {
            return;
        };
        let mut peers = self.peers.borrow_mut();
        let mut next = Vec::with_capacity(peers.len() + 1);
        for name in list.split(|&b| b == b'\n') {
            let Ok(name) = std::str::from_utf8(name) else {
                continue;
            };
            if name.is_empty() || name == self.own {
                continue;
            }
            if let Some(p) = peers.iter().find(|(n, _)| n == name) {
                next.push(p.clone());
            } else if let Some(id) = self.resolve(name) {
                next.push((name.to_string(), id));
            }
        }
        *peers = next;
    }

    fn resolve(&self, name: &str) -> Option<u32> {
        let mut id = 0u32;
        let status = unsafe {
            proxy_resolve_shared_queue(
                self.vm_id.as_ptr(),
                self.vm_id.len(),
                name.as_ptr(),
                name.len(),
                &mut id,
            )
        };
        (status == OK).then_some(id)
    }

    /// Other workers this one sends to.
    pub fn peers(&self) -> usize {
        self.peers.borrow().len()
    }

    /// Sends `msg` to every other member; returns how many copies could not be queued.
    pub fn send(&self, msg: &[u8]) -> usize {
        self.peers
            .borrow()
            .iter()
            .filter(
                |(_, id)| unsafe { proxy_enqueue_shared_queue(*id, msg.as_ptr(), msg.len()) } != OK,
            )
            .count()
    }

    /// Hands every message waiting for this worker (at most [`MAX_DRAIN`]) to `f`, oldest first.
    pub fn drain(&self, mut f: impl FnMut(&[u8])) {
        for _ in 0..MAX_DRAIN {
            let mut data = std::ptr::null_mut();
            let mut size = 0usize;
            let status = unsafe { proxy_dequeue_shared_queue(self.own_id, &mut data, &mut size) };
            if status != OK {
                // EMPTY, or the queue is gone: either way nothing more to read now.
                return;
            }
            let msg = unsafe { take(data, size) };
            if msg == HELLO {
                self.refresh();
            } else {
                f(&msg);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_listed_once_and_the_oldest_go_first() {
        let one = with_member(b"", "a");
        assert_eq!(one, b"a");
        assert_eq!(with_member(&one, "a"), b"a");
        let mut list = one;
        for i in 0..MAX_MEMBERS {
            list = with_member(&list, &format!("m{i}"));
        }
        let names: Vec<&[u8]> = list.split(|&b| b == b'\n').collect();
        assert_eq!(names.len(), MAX_MEMBERS);
        assert_eq!(names[0], b"m0", "a, the oldest, was dropped");
        assert_eq!(
            *names.last().unwrap(),
            format!("m{}", MAX_MEMBERS - 1).as_bytes()
        );
    }
}
