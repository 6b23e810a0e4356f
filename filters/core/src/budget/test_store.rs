//! Envoy's shared-data semantics for the budget tests: a new CAS token per write, an absent
//! key accepts any token, and a hook that runs once before the next `set` (another worker's
//! write landing between this worker's read and its write).

use crate::shared_data::{ReadFailed, SetError, SharedData};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

pub type Map = HashMap<String, (Vec<u8>, u32)>;
pub type Hook = Box<dyn FnOnce(&Envoyish)>;

pub fn envoy_set(
    map: &mut Map,
    tokens: &mut u32,
    key: &str,
    value: &[u8],
    cas: Option<u32>,
) -> Result<(), SetError> {
    if let (Some(c), Some((_, cur))) = (cas, map.get(key)) {
        if c != *cur {
            return Err(SetError::CasMismatch);
        }
    }
    *tokens += 1;
    map.insert(key.to_string(), (value.to_vec(), *tokens));
    Ok(())
}

#[derive(Default)]
pub struct Envoyish {
    pub map: RefCell<Map>,
    pub tokens: Cell<u32>,
    /// Runs once before the next `set`, as another worker's write landing in between.
    pub interleave: RefCell<Option<Hook>>,
}

impl SharedData for Envoyish {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, ReadFailed> {
        Ok(self.map.borrow().get(key).cloned())
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SetError> {
        let hook = self.interleave.borrow_mut().take();
        if let Some(f) = hook {
            f(self);
        }
        let mut t = self.tokens.get();
        let r = envoy_set(&mut self.map.borrow_mut(), &mut t, key, value, cas);
        self.tokens.set(t);
        r
    }
}
