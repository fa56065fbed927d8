//! Fixed-capacity slab whose keys carry a generation, so a stale or
//! duplicated `wr_id` can never name a reused slot.

/// A slot index plus the generation it had when the key was issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

impl Key {
    /// `wr_id` layout: generation in the high half, index in the low half.
    #[inline(always)]
    pub(crate) fn to_wr_id(self) -> u64 {
        (u64::from(self.generation) << 32) | u64::from(self.index)
    }

    #[inline(always)]
    pub(crate) const fn from_wr_id(wr_id: u64) -> Key {
        Key {
            index: wr_id as u32,
            generation: (wr_id >> 32) as u32,
        }
    }
}

struct Entry<T> {
    generation: u32,
    value: Option<T>,
    next_free: u32,
}

const NO_FREE: u32 = u32::MAX;

/// A full slab's insert, or a free list that names an occupied slot: the
/// caller broke the slab's contract (or the slab its own), and going on
/// could hand one slot to two operations.
#[cold]
#[inline(never)]
fn broken_free_list() -> ! {
    panic!("slab: no free slot where the free list or the caller said there was one")
}

/// Allocation happens in `with_capacity` and `grow` (when queues are
/// attached); inserting into a full slab fails instead of growing, so the
/// steady state allocates nothing.
pub(crate) struct Slab<T> {
    entries: Vec<Entry<T>>,
    free_head: u32,
    len: usize,
}

impl<T> Slab<T> {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        assert!(capacity < NO_FREE as usize, "slab capacity too large");
        let entries = (0..capacity)
            .map(|i| Entry {
                generation: 0,
                value: None,
                next_free: if i + 1 < capacity {
                    i as u32 + 1
                } else {
                    NO_FREE
                },
            })
            .collect();
        Slab {
            entries,
            free_head: if capacity == 0 { NO_FREE } else { 0 },
            len: 0,
        }
    }

    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn capacity(&self) -> usize {
        self.entries.len()
    }

    /// Adds `more` free slots.
    pub(crate) fn grow(&mut self, more: usize) {
        let old = self.entries.len();
        let new = old + more;
        assert!(new < NO_FREE as usize, "slab capacity too large");
        self.entries.reserve_exact(more);
        for i in old..new {
            self.entries.push(Entry {
                generation: 0,
                value: None,
                next_free: if i + 1 < new {
                    i as u32 + 1
                } else {
                    self.free_head
                },
            });
        }
        if more > 0 {
            self.free_head = old as u32;
        }
    }

    /// The value in slot `index`, whatever its generation (a round-robin
    /// walk over the table).
    #[inline(always)]
    pub(crate) fn at_mut(&mut self, index: u32) -> Option<&mut T> {
        self.entries.get_mut(index as usize)?.value.as_mut()
    }

    /// The key of the value in slot `index`, if there is one (a walk over
    /// the table that allocates nothing).
    #[inline(always)]
    pub(crate) fn key_at(&self, index: u32) -> Option<Key> {
        let entry = self.entries.get(index as usize)?;
        entry.value.as_ref().map(|_| Key {
            index,
            generation: entry.generation,
        })
    }

    /// Keys of every value, in slot order.
    pub(crate) fn keys(&self) -> Vec<Key> {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.value.is_some())
            .map(|(i, e)| Key {
                index: i as u32,
                generation: e.generation,
            })
            .collect()
    }

    #[inline(always)]
    pub(crate) fn insert(&mut self, value: T) -> Option<Key> {
        if self.free_head == NO_FREE {
            return None;
        }
        Some(self.insert_with_room(value))
    }

    /// Inserts into a slab the caller has just seen to have room
    /// (`len() < capacity()`).
    ///
    /// # Panics
    ///
    /// If the free list names no free slot (a broken invariant), leaking
    /// the value. Every path forgets the value before it could drop it or
    /// unwind, so none keeps it alive across a call: the compiler then
    /// writes it in place rather than building it on the stack and copying
    /// it in (which costs a push a copy of its whole entry).
    #[inline(always)]
    pub(crate) fn insert_with_room(&mut self, value: T) -> Key {
        let index = self.free_head;
        let Some(entry) = self
            .entries
            .get_mut(index as usize)
            .filter(|entry| entry.value.is_none())
        else {
            std::mem::forget(value);
            broken_free_list();
        };
        self.free_head = entry.next_free;
        // `replace` hands back the `None` just seen: forgetting it leaves
        // no drop call behind.
        std::mem::forget(entry.value.replace(value));
        self.len += 1;
        Key {
            index,
            generation: entry.generation,
        }
    }

    #[inline(always)]
    fn entry(&self, key: Key) -> Option<&Entry<T>> {
        self.entries
            .get(key.index as usize)
            .filter(|e| e.generation == key.generation && e.value.is_some())
    }

    #[inline(always)]
    pub(crate) fn get(&self, key: Key) -> Option<&T> {
        self.entry(key).and_then(|e| e.value.as_ref())
    }

    #[inline(always)]
    pub(crate) fn get_mut(&mut self, key: Key) -> Option<&mut T> {
        self.entries
            .get_mut(key.index as usize)
            .filter(|e| e.generation == key.generation)
            .and_then(|e| e.value.as_mut())
    }

    #[inline(always)]
    pub(crate) fn remove(&mut self, key: Key) -> Option<T> {
        self.entry(key)?;
        let entry = &mut self.entries[key.index as usize];
        let value = entry.value.take();
        entry.generation = entry.generation.wrapping_add(1);
        entry.next_free = self.free_head;
        self.free_head = key.index;
        self.len -= 1;
        value
    }

    /// Removes the value of `key`, which the caller has just found present
    /// (no second generation check).
    #[inline(always)]
    pub(crate) fn remove_present(&mut self, key: Key) -> T {
        let entry = &mut self.entries[key.index as usize];
        debug_assert_eq!(entry.generation, key.generation);
        let value = entry.value.take().expect("the caller found it present");
        entry.generation = entry.generation.wrapping_add(1);
        entry.next_free = self.free_head;
        self.free_head = key.index;
        self.len -= 1;
        value
    }

    /// Removes every value, for teardown.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        let keys = self.keys();
        keys.into_iter().filter_map(move |k| self.remove(k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_keys_miss() {
        let mut slab = Slab::with_capacity(2);
        let a = slab.insert("a").unwrap();
        assert_eq!(slab.remove(a), Some("a"));
        let b = slab.insert("b").unwrap();
        assert_ne!(a.to_wr_id(), b.to_wr_id(), "reused slot, new generation");
        assert_eq!(slab.get(a), None);
        assert_eq!(slab.remove(a), None);
        assert_eq!(slab.get(Key::from_wr_id(b.to_wr_id())), Some(&"b"));
    }

    #[test]
    fn growing_keeps_keys_and_adds_room() {
        let mut slab = Slab::with_capacity(1);
        let a = slab.insert("a").unwrap();
        assert!(slab.insert("b").is_none());
        slab.grow(2);
        let b = slab.insert("b").unwrap();
        let c = slab.insert("c").unwrap();
        assert!(slab.insert("d").is_none());
        assert_eq!(
            (slab.get(a), slab.get(b), slab.get(c)),
            (Some(&"a"), Some(&"b"), Some(&"c"))
        );
        slab.remove(b);
        assert_eq!(slab.insert("e").map(|k| k.index), Some(b.index));
    }

    #[test]
    fn key_at_walks_values_and_remove_present_frees_the_slot() {
        let mut slab = Slab::with_capacity(2);
        let a = slab.insert("a").unwrap();
        assert_eq!(slab.remove_present(a), "a");
        let b = slab.insert("b").unwrap();
        assert_eq!(b.index, a.index, "the freed slot is reused");
        assert_ne!(b, a, "with a new generation");
        assert_eq!(slab.key_at(b.index), Some(b));
        assert_eq!(slab.key_at(1), None, "an empty slot has no key");
        assert_eq!(slab.key_at(7), None, "past the end");
        assert_eq!(slab.get(a), None, "the stale key misses");
    }

    #[test]
    fn insert_with_room_takes_the_free_slot_a_remove_left() {
        let mut slab = Slab::with_capacity(2);
        let a = slab.insert_with_room("a");
        let b = slab.insert_with_room("b");
        assert_eq!(slab.len(), 2);
        assert_eq!(slab.remove(a), Some("a"));
        let c = slab.insert_with_room("c");
        assert_eq!(c.index, a.index, "the freed slot is reused");
        assert_ne!(c, a, "with a new generation");
        assert_eq!(
            (slab.get(b), slab.get(c), slab.get(a)),
            (Some(&"b"), Some(&"c"), None)
        );
    }

    #[test]
    #[should_panic(expected = "no free slot")]
    fn insert_with_room_on_a_full_slab_panics() {
        let mut slab = Slab::with_capacity(1);
        slab.insert_with_room(1);
        slab.insert_with_room(2);
    }

    #[test]
    fn full_slab_refuses() {
        let mut slab = Slab::with_capacity(1);
        slab.insert(1).unwrap();
        assert!(slab.insert(2).is_none());
        assert_eq!(slab.len(), 1);
        assert_eq!(slab.get(Key::from_wr_id(u64::MAX)), None);
    }
}
