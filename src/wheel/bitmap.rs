//! Occupancy bitmap of one wheel level.

/// The widest level a [`Bitmap`] supports: 64 words of 64 bits under one summary word.
pub(crate) const MAX_BITS: usize = 64 * 64;

/// A two-layer bitmap: one bit per slot, plus a summary word with one bit per non-empty
/// 64-slot word, so the first occupied slot is found with two `trailing_zeros` and no scan.
#[derive(Debug, Clone)]
pub(crate) struct Bitmap {
    summary: u64,
    words: Box<[u64]>,
}

impl Bitmap {
    /// A bitmap of `bits` clear bits. `bits` must be at most [`MAX_BITS`].
    pub(crate) fn new(bits: usize) -> Self {
        debug_assert!(bits <= MAX_BITS);
        Bitmap {
            summary: 0,
            words: vec![0; bits.div_ceil(64)].into_boxed_slice(),
        }
    }

    pub(crate) fn set(&mut self, bit: usize) {
        let word = bit / 64;
        self.words[word] |= 1 << (bit % 64);
        self.summary |= 1 << word;
    }

    pub(crate) fn clear(&mut self, bit: usize) {
        let word = bit / 64;
        self.words[word] &= !(1 << (bit % 64));
        if self.words[word] == 0 {
            self.summary &= !(1 << word);
        }
    }

    /// The lowest set bit, if any.
    pub(crate) fn first_set(&self) -> Option<usize> {
        if self.summary == 0 {
            return None;
        }
        let word = self.summary.trailing_zeros() as usize;
        Some(word * 64 + self.words[word].trailing_zeros() as usize)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.summary == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_set_finds_lowest_bit_across_words() {
        let mut bitmap = Bitmap::new(MAX_BITS);
        assert_eq!(bitmap.first_set(), None);
        bitmap.set(4000);
        bitmap.set(130);
        assert_eq!(bitmap.first_set(), Some(130));
        bitmap.clear(130);
        assert_eq!(bitmap.first_set(), Some(4000));
        bitmap.clear(4000);
        assert!(bitmap.is_empty());
    }

    #[test]
    fn clearing_one_bit_keeps_neighbours_in_the_same_word() {
        let mut bitmap = Bitmap::new(100);
        bitmap.set(65);
        bitmap.set(70);
        bitmap.clear(65);
        assert_eq!(bitmap.first_set(), Some(70));
    }
}
