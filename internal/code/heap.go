package code

// The C heap of one parse. tree-sitter allocates its trees, stacks and
// query state with malloc, outside Go's heap and its limits: 760 KB of
// nested or densely packed brackets take 250-300 MB of it, and sixteen
// such parses at once took klbr-core past 4 GB. So tree-sitter allocates
// through the functions below (installed once, at init, for the whole
// process: tree-sitter's allocator is a process-wide setting of the C
// library). They count what a parse holds on its own thread: a parse runs
// on a goroutine locked to its OS thread between heapBegin and heapEnd,
// and tree-sitter never moves a parse to another thread, so a thread-local
// budget is exactly that parse's. A parse over its budget raises the
// parser's cancellation flag; tree-sitter checks it every 100 operations,
// so it stops a few kilobytes past its bound and returns no tree.
//
// These are plain C, not go-tree-sitter's default (a callback into Go on
// every malloc), so they cost less than what they replace.

/*
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

void ts_set_allocator(void *(*)(size_t), void *(*)(size_t, size_t), void *(*)(void *, size_t), void (*)(void *));

typedef struct {
	size_t flag;   // the parser's cancellation flag: nonzero stops it
	int64_t live;  // bytes this parse holds now
	int64_t peak;  // the most it held
	int64_t limit; // over this, it is stopped
	int over;      // it went over limit
} klbr_heap;

static __thread klbr_heap *klbr_cur;

static void klbr_count(int64_t d) {
	klbr_heap *h = klbr_cur;
	if (h == NULL) return;
	h->live += d;
	if (h->live > h->peak) h->peak = h->live;
	if (h->live > h->limit && !h->over) {
		h->over = 1;
		__atomic_store_n(&h->flag, 1, __ATOMIC_SEQ_CST);
	}
}

static void *klbr_fail(size_t n) {
	fprintf(stderr, "tree-sitter failed to allocate %zu bytes\n", n);
	abort();
}

static void *klbr_malloc(size_t n) {
	void *p = malloc(n);
	if (p == NULL && n > 0) return klbr_fail(n);
	if (p != NULL) klbr_count((int64_t)malloc_usable_size(p));
	return p;
}

static void *klbr_calloc(size_t k, size_t n) {
	void *p = calloc(k, n);
	if (p == NULL && k > 0 && n > 0) return klbr_fail(k * n);
	if (p != NULL) klbr_count((int64_t)malloc_usable_size(p));
	return p;
}

static void *klbr_realloc(void *old, size_t n) {
	int64_t was = old != NULL ? (int64_t)malloc_usable_size(old) : 0;
	void *p = realloc(old, n);
	if (p == NULL && n > 0) return klbr_fail(n);
	klbr_count((p != NULL ? (int64_t)malloc_usable_size(p) : 0) - was);
	return p;
}

static void klbr_free(void *p) {
	if (p == NULL) return;
	klbr_count(-(int64_t)malloc_usable_size(p));
	free(p);
}

static void klbr_install(void) {
	ts_set_allocator(klbr_malloc, klbr_calloc, klbr_realloc, klbr_free);
}

static klbr_heap *klbr_heap_new(int64_t limit) {
	klbr_heap *h = calloc(1, sizeof(klbr_heap));
	if (h == NULL) klbr_fail(sizeof(klbr_heap));
	h->limit = limit;
	return h;
}

static void klbr_heap_begin(klbr_heap *h) { klbr_cur = h; }
static void klbr_heap_end(void) { klbr_cur = NULL; }
static void klbr_trim(void) { malloc_trim(0); }
*/
import "C"

import (
	"runtime"
	"sync/atomic"
	"unsafe"
)

// go-tree-sitter installs its allocator in its own init, which runs before
// this package's: this one replaces it before any parser exists.
func init() { C.klbr_install() }

// heap is one parse's C-heap budget. It lives in C memory, so the parser
// may keep a pointer to its flag for the whole parse.
type heap struct{ h *C.klbr_heap }

func newHeap(limit int64) heap { return heap{C.klbr_heap_new(C.int64_t(limit))} }

// flag is the parser's cancellation flag: set when the parse goes over
// its budget or when cancel is called.
func (h heap) flag() *uintptr { return (*uintptr)(unsafe.Pointer(&h.h.flag)) }

func (h heap) cancel() { atomic.StoreUintptr(h.flag(), 1) }

// begin counts what tree-sitter allocates on this goroutine's thread
// against h, until end. The goroutine stays on its thread in between.
func (h heap) begin() {
	runtime.LockOSThread()
	C.klbr_heap_begin(h.h)
}

func (h heap) end() {
	C.klbr_heap_end()
	runtime.UnlockOSThread()
}

// over says whether the parse went over its budget.
func (h heap) over() bool { return atomic.LoadInt32((*int32)(unsafe.Pointer(&h.h.over))) != 0 }

func (h heap) peak() int64 { return int64(h.h.peak) }

func (h heap) free() { C.free(unsafe.Pointer(h.h)) }

// trimHeap hands the C heap's free memory back to the system. glibc keeps
// what a thread's arena freed; after a large parse, that is hundreds of
// megabytes klbr-core would otherwise hold for nothing.
func trimHeap() { C.klbr_trim() }
