//! Per-request state of plugins: one typed slot per type, per request.
//!
//! A plugin keeps what it learns in one phase for a later one (the compression it chose in
//! `header_filter` for `body_filter`, a span opened in `rewrite` and closed in `log`, a
//! concurrency permit held until the response ends) in a slot keyed by a type of its own
//! crate, so no other plugin can read or clobber it. A request whose plugins keep no state
//! allocates nothing.
//!
//! ```
//! use weir_plugin::slots::Slots;
//!
//! struct Started(u64); // private to the plugin: the key of its slot
//! let mut slots = Slots::default();
//! slots.insert(Started(7));
//! assert_eq!(slots.get::<Started>().map(|s| s.0), Some(7));
//! assert!(slots.remove::<Started>().is_some());
//! assert!(slots.get::<Started>().is_none());
//! ```

use std::any::{Any, TypeId};

/// Typed values of one request (see the module documentation).
#[derive(Default)]
pub struct Slots {
    items: Vec<(TypeId, Box<dyn Any>)>,
}

impl Slots {
    /// Stores `value` in the slot of its type, replacing what was there.
    pub fn insert<T: Any>(&mut self, value: T) {
        let id = TypeId::of::<T>();
        match self.items.iter_mut().find(|(t, _)| *t == id) {
            Some(slot) => slot.1 = Box::new(value),
            None => self.items.push((id, Box::new(value))),
        }
    }
    /// The value in the slot of type `T`.
    pub fn get<T: Any>(&self) -> Option<&T> {
        let id = TypeId::of::<T>();
        self.items.iter().find(|(t, _)| *t == id).and_then(|(_, v)| v.downcast_ref())
    }
    /// The value in the slot of type `T`, mutable.
    pub fn get_mut<T: Any>(&mut self) -> Option<&mut T> {
        let id = TypeId::of::<T>();
        self.items.iter_mut().find(|(t, _)| *t == id).and_then(|(_, v)| v.downcast_mut())
    }
    /// Takes the value out of the slot of type `T`.
    pub fn remove<T: Any>(&mut self) -> Option<T> {
        let id = TypeId::of::<T>();
        let at = self.items.iter().position(|(t, _)| *t == id)?;
        self.items.swap_remove(at).1.downcast().ok().map(|b| *b)
    }
    /// Whether no slot holds a value.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}
