//! The bodies being read at once per key ([`BodyLimits::reading_per_key`]): what one client
//! can make the server hold while its bodies come.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::BodyLimits;
use crate::key::Key;

/// How many bodies each key has being read, none kept for a key with none.
#[derive(Debug)]
pub(crate) struct Readers {
    most: usize,
    reading: Mutex<HashMap<Key, usize>>,
}

/// One body being read for a key: counted until dropped (read, refused or abandoned).
#[derive(Debug)]
pub(crate) struct Reader {
    readers: Arc<Readers>,
    key: Key,
}

impl Readers {
    /// The count of bodies read within `limits`.
    pub(crate) fn new(limits: &BodyLimits) -> Arc<Self> {
        Arc::new(Readers {
            most: limits.get_reading_per_key(),
            reading: Mutex::new(HashMap::new()),
        })
    }

    /// A body to read for `key`, or `None` when it has as many being read as it may.
    pub(crate) fn enter(self: &Arc<Self>, key: Key) -> Option<Reader> {
        let mut reading = self.reading.lock().unwrap_or_else(|e| e.into_inner());
        let count = reading.entry(key.clone()).or_insert(0);
        if *count >= self.most {
            return None;
        }
        *count += 1;
        Some(Reader {
            readers: self.clone(),
            key,
        })
    }

    /// The keys with a body being read.
    #[cfg(test)]
    fn keys(&self) -> usize {
        self.reading.lock().unwrap().len()
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let mut reading = (self.readers.reading.lock()).unwrap_or_else(|e| e.into_inner());
        if let Some(count) = reading.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                reading.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{BodyLimits, Key, Readers};

    #[test]
    fn a_key_reads_at_most_its_bodies_and_is_forgotten_with_none() {
        let readers = Readers::new(&BodyLimits::new().reading_per_key(2));
        let (a, b) = (Key::from("a"), Key::from("b"));
        let first = readers.enter(a.clone()).expect("one");
        let second = readers.enter(a.clone()).expect("two");
        assert!(
            readers.enter(a.clone()).is_none(),
            "a third waits for one to end"
        );
        let other = readers.enter(b).expect("another key has its own");
        drop(first);
        let third = readers.enter(a).expect("one ended");
        drop((second, third, other));
        assert_eq!(readers.keys(), 0, "no key is kept with no body being read");
    }
}
