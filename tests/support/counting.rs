//! A global allocator that counts live heap bytes, for the tests that watch memory come
//! back. Included by path (`#[path = "support/counting.rs"] mod counting;`) only where it is
//! installed, with `#[global_allocator] static ALLOCATOR: Counting = Counting;`.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, Ordering};

/// Counts live heap bytes in [`LIVE`], and their high-water mark in [`PEAK`]; and, per
/// thread, the bytes each thread has allocated ([`allocated_by_this_thread`]).
pub struct Counting;

std::thread_local! {
    /// Bytes this thread has allocated so far (growth by `realloc` included; frees not
    /// counted). No destructor, so reading it never fails, even as the thread ends.
    static ALLOCATED_HERE: Cell<u64> = const { Cell::new(0) };
}

/// Bytes the calling thread has allocated so far: the difference between two reads is what
/// the thread allocated in between, whatever other threads did.
pub fn allocated_by_this_thread() -> u64 {
    ALLOCATED_HERE.with(Cell::get)
}

pub static LIVE: AtomicIsize = AtomicIsize::new(0);
pub static PEAK: AtomicIsize = AtomicIsize::new(0);

/// Starts a new high-water mark from the bytes live now.
pub fn reset_peak() {
    PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
}

fn grow(bytes: isize) {
    let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(live, Ordering::Relaxed);
    if bytes > 0 {
        let _ = ALLOCATED_HERE.try_with(|here| here.set(here.get() + bytes as u64));
    }
}

// SAFETY: forwards every call unchanged to the system allocator; counting is a side effect.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grow(layout.size() as isize);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        grow(new_size as isize - layout.size() as isize);
        // SAFETY: forwarded with the caller's arguments.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
