//! A worker's wake-up call to its own root context: a shared queue only this worker registers
//! and enqueues on, so that work an HTTP context hands over (kept in the worker's own memory)
//! is carried out in the root's `on_queue_ready`, soon after the callback that rang. What the
//! root starts there (a callout) belongs to the root, not to the request, and outlives it.

use crate::abi::*;
use crate::types::{check, take, HostResult, OK};

/// Most messages one drain takes, so one callback's work stays bounded.
pub const MAX_DRAIN: usize = 1024;

pub struct Wake {
    id: u32,
}

impl Wake {
    /// Registers this worker's queue `name` (unique per worker, e.g. with a random part).
    pub fn register(name: &str) -> HostResult<Wake> {
        let mut id = 0u32;
        check("proxy_register_shared_queue", unsafe {
            proxy_register_shared_queue(name.as_ptr(), name.len(), &mut id)
        })?;
        Ok(Wake { id })
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    /// Asks the host for an `on_queue_ready` on this worker's root.
    pub fn ring(&self) -> HostResult<()> {
        check("proxy_enqueue_shared_queue", unsafe {
            proxy_enqueue_shared_queue(self.id, [0u8].as_ptr(), 1)
        })
    }

    /// Empties the queue (at most [`MAX_DRAIN`] rings): the rings carry nothing.
    pub fn drain(&self) {
        for _ in 0..MAX_DRAIN {
            let mut data = std::ptr::null_mut();
            let mut size = 0usize;
            let status = unsafe { proxy_dequeue_shared_queue(self.id, &mut data, &mut size) };
            if status != OK {
                return;
            }
            drop(unsafe { take(data, size) });
        }
    }
}
