//! The allocator for policy components: a bump arena over the instance's linear memory.
//!
//! The host runs every decision in a fresh instance, so nothing a guest allocates outlives
//! the call that allocated it. A bump arena fits that life exactly: allocation is a pointer
//! move, freeing the newest block gives it back, and the arena starts inside the memory the
//! module already has (from `__heap_base` to the end of its initial memory). Rust's default
//! allocator instead grows memory on its first allocation, which costs the host a
//! memory-protection change (and a TLB flush on every core) per decision. Memory grows only
//! when a call needs more than the initial memory holds; the host's memory limit bounds it.

use core::alloc::{GlobalAlloc, Layout};
use core::arch::wasm32;
use core::cell::Cell;

const PAGE: usize = 65_536;

extern "C" {
    /// Where the linker put the end of the stack and static data: the heap starts here.
    static __heap_base: u8;
}

/// A bump allocator for one short-lived instance. Installed by this crate as the global
/// allocator (feature `call-arena`, on by default).
pub struct CallArena {
    /// The next free byte (0 until the first allocation).
    next: Cell<usize>,
    /// One past the last byte of linear memory known to be available.
    end: Cell<usize>,
}

// A wasm32 instance is single-threaded.
unsafe impl Sync for CallArena {}

impl CallArena {
    pub const fn new() -> Self {
        CallArena {
            next: Cell::new(0),
            end: Cell::new(0),
        }
    }

    fn start(&self) {
        if self.next.get() == 0 {
            // SAFETY: only the address of the linker-defined symbol is taken.
            let base = core::ptr::addr_of!(__heap_base) as usize;
            self.next.set(base);
            self.end.set(wasm32::memory_size(0) * PAGE);
        }
    }

    /// Makes sure `[.., upto)` is inside linear memory, growing it if needed.
    fn reserve(&self, upto: usize) -> bool {
        if upto <= self.end.get() {
            return true;
        }
        let pages = (upto - self.end.get()).div_ceil(PAGE);
        if wasm32::memory_grow(0, pages) == usize::MAX {
            return false;
        }
        self.end.set(self.end.get() + pages * PAGE);
        true
    }
}

impl Default for CallArena {
    fn default() -> Self {
        Self::new()
    }
}

unsafe impl GlobalAlloc for CallArena {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.start();
        let Some(begin) = self.next.get().checked_next_multiple_of(layout.align()) else {
            return core::ptr::null_mut();
        };
        let Some(end) = begin.checked_add(layout.size()) else {
            return core::ptr::null_mut();
        };
        if !self.reserve(end) {
            return core::ptr::null_mut();
        }
        self.next.set(end);
        begin as *mut u8
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // The newest block goes back; older ones are freed with the instance.
        if ptr as usize + layout.size() == self.next.get() {
            self.next.set(ptr as usize);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let begin = ptr as usize;
        if begin + layout.size() == self.next.get() {
            // The newest block grows or shrinks in place.
            let Some(end) = begin.checked_add(new_size) else {
                return core::ptr::null_mut();
            };
            if !self.reserve(end) {
                return core::ptr::null_mut();
            }
            self.next.set(end);
            return ptr;
        }
        if new_size <= layout.size() {
            return ptr;
        }
        // SAFETY: the caller guarantees `layout.align()` is valid and `new_size` is non-zero.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            unsafe { core::ptr::copy_nonoverlapping(ptr, new, layout.size()) };
        }
        new
    }
}
