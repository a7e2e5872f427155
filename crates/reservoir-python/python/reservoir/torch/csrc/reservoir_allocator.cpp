// Reservoir's C++ face for torch: a c10::cuda::CUDACachingAllocator::CUDAAllocator
// whose every method is answered by Reservoir (issue 32, item 1).
//
// Built by reservoir.torch.enable() with torch.utils.cpp_extension.load against
// the installed torch (2.11 to 2.15; the interface differences are behind
// TORCH_VERSION_MINOR checks below). It calls the C ABI of reservoir-capi that
// reservoir/_native.abi3.so exports: the library is already loaded by Python
// (import reservoir._native), so init() finds it with dlopen(RTLD_NOLOAD) and
// resolves each entry point with dlsym. No link-time dependency: the allocator
// state is the one the Python functions of reservoir.torch read.
//
// Why a subclass of CUDAAllocator and not of torch::cuda::CUDAPluggableAllocator:
// the pluggable class answers most of the interface with "does not yet support"
// errors, keeps its own map of every live pointer (one more lock and a hash map
// per allocation, which Reservoir already has), and its hooks have fixed
// signatures (no OOM text, no stats, no snapshot). We would override every
// method anyway; deriving from CUDAAllocator directly keeps one lookup per call
// and lets the OOM path raise torch's OutOfMemoryError with Reservoir's text.
//
// Every method either forwards to Reservoir or raises
// "reservoir: <method> is not supported: <why>" -- never a silent no-op.

#include <torch/extension.h>
#include <torch/version.h>

#include <c10/core/AllocatorConfig.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/GPUTrace.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/ApproximateClock.h>

#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

// The interface differences between the torch 2.11 and 2.15 headers
// (c10/cuda/CUDACachingAllocator.h, c10/core/CachingDeviceAllocator.h),
// each checked by compiling this file against that version's headers:
//   2.12+: attachOomRejectionObserver (pure virtual), DeviceStats::num_oom_rejections;
//   2.13+: AllocatorConfigInfo::max_round_threshold / max_cached_size;
//          DeviceStats::reserved_bytes_by_private_pools (reservoir_torch_private_pool_stats);
//          markCaptureBegin/End (defaults kept: nothing to do for Reservoir);
//   2.14+: SnapshotInfo::host_segments / host_traces (left empty: no host memory);
//   2.15:  supportsUserMetadata / annotateMemory / allocateWithAddress /
//          getContextForPointer (torch's defaults: warn, or raise naming "reservoir").
#define RESERVOIR_TORCH_AT_LEAST(minor) \
  (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= (minor)))

namespace reservoir_face {

using namespace c10::cuda::CUDACachingAllocator;
namespace cda = c10::CachingDeviceAllocator;

// ---- the C ABI (crates/reservoir-capi/src/torch_face.rs, torch_state.rs) ---

struct ReservoirTorchOom {
  uint64_t alloc_size;
  uint64_t device_total;
  uint64_t device_free;
  char* message;
  size_t capacity;
  size_t length;
};

constexpr int kOk = 0;
constexpr int kOutOfMemory = 6;
constexpr size_t kStatsLen = 123;
constexpr size_t kPrivatePoolStatsLen = 14;

using StreamFilter = bool (*)(void*, void*);
using FilterDrop = void (*)(void*);
using PoolAllocFn = void* (*)(void*, uint64_t, int32_t, void*);
using PoolFreeFn = void (*)(void*, void*, uint64_t, int32_t, void*);
using ContextRecorderFn = uint64_t (*)();
using TraceTrackerFn = void (*)(void*, int32_t, int32_t, uint64_t, uint64_t, void*, uint64_t, uint64_t, int64_t);

struct StreamSegmentSizeC {
  uint64_t stream;
  bool is_small_pool;
  uint64_t total_size;
};

struct Api {
  int (*malloc)(size_t, int32_t, void*, void**, ReservoirTorchOom*);
  int (*del)(void*);
  int (*device_stats)(int32_t, int64_t*, size_t);
  int (*private_pool_stats)(int32_t, int64_t*, size_t, size_t*);
  int (*reset_peak)(int32_t);
  int (*reset_accumulated)(int32_t);
  int (*empty_cache_pool)(uint64_t, uint64_t);
  int (*set_fraction)(int32_t, double);
  int (*fraction)(int32_t, double*);
  int (*cache_info)(int32_t, uint64_t*);
  int (*base_allocation)(void*, void**, uint64_t*);
  int (*record_stream)(void*, void*);
  int (*begin_pool)(int32_t, uint64_t, uint64_t, StreamFilter, void*, FilterDrop);
  int (*end_pool)(int32_t, uint64_t, uint64_t);
  int (*release_pool)(int32_t, uint64_t, uint64_t);
  int (*create_or_incref_pool)(int32_t, uint64_t, uint64_t);
  int (*create_pool_with_allocator)(int32_t, uint64_t, uint64_t, PoolAllocFn, PoolFreeFn, void*, FilterDrop);
  int (*pool_use_count)(int32_t, uint64_t, uint64_t, uint32_t*);
  int (*check_pool_live)(int32_t, uint64_t, uint64_t, const uint64_t*, size_t, bool*);
  int (*record_history)(bool, bool, ContextRecorderFn, size_t, int32_t, bool);
  int (*is_history_enabled)(bool*);
  int (*snapshot)(uint64_t, uint64_t, bool, uint8_t**, size_t*);
  void (*buffer_free)(uint8_t*, size_t);
  int (*attach_trace_tracker)(TraceTrackerFn, void*);
  int (*expandable_segment_sizes)(int32_t, StreamSegmentSizeC*, size_t, size_t*);
  int (*checkpoint_pool)(int32_t, uint64_t, uint64_t, void**);
  void (*checkpoint_free)(void*);
  int (*restore_checkpoint)(const void*, uint64_t**, size_t*, uint64_t**, size_t*);
  void (*u64s_free)(uint64_t*, size_t);
  int (*set_allocator_settings)(const char*);
  int (*set_no_split)(int32_t, uint64_t, uint64_t);
  int (*set_use_on_oom)(int32_t, uint64_t, uint64_t, int32_t);
  const char* (*last_error)();
  const char* (*status_name)(int);
};

Api api{};
bool api_loaded = false;

template <typename F>
void resolve(void* lib, const char* name, F& slot) {
  void* sym = dlsym(lib, name);
  TORCH_CHECK(sym != nullptr, "reservoir: the native library lacks ", name,
              " (a reservoir wheel older than this face?)");
  slot = reinterpret_cast<F>(sym);
}

void load_api(const std::string& path) {
  if (api_loaded) return;
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) lib = dlopen(path.c_str(), RTLD_NOW);
  TORCH_CHECK(lib != nullptr, "reservoir: cannot open ", path, ": ", dlerror());
  resolve(lib, "reservoir_torch_malloc", api.malloc);
  resolve(lib, "reservoir_torch_delete", api.del);
  resolve(lib, "reservoir_torch_device_stats", api.device_stats);
  resolve(lib, "reservoir_torch_private_pool_stats", api.private_pool_stats);
  resolve(lib, "reservoir_torch_reset_peak_stats", api.reset_peak);
  resolve(lib, "reservoir_torch_reset_accumulated_stats", api.reset_accumulated);
  resolve(lib, "reservoir_torch_empty_cache_pool", api.empty_cache_pool);
  resolve(lib, "reservoir_torch_set_memory_fraction", api.set_fraction);
  resolve(lib, "reservoir_torch_memory_fraction", api.fraction);
  resolve(lib, "reservoir_torch_cache_info", api.cache_info);
  resolve(lib, "reservoir_torch_base_allocation", api.base_allocation);
  resolve(lib, "reservoir_torch_record_stream", api.record_stream);
  resolve(lib, "reservoir_torch_begin_allocate_to_pool", api.begin_pool);
  resolve(lib, "reservoir_torch_end_allocate_to_pool", api.end_pool);
  resolve(lib, "reservoir_torch_release_pool", api.release_pool);
  resolve(lib, "reservoir_torch_create_or_incref_pool", api.create_or_incref_pool);
  resolve(lib, "reservoir_torch_create_or_incref_pool_with_allocator", api.create_pool_with_allocator);
  resolve(lib, "reservoir_torch_pool_use_count", api.pool_use_count);
  resolve(lib, "reservoir_torch_check_pool_live_allocations", api.check_pool_live);
  resolve(lib, "reservoir_torch_record_history", api.record_history);
  resolve(lib, "reservoir_torch_is_history_enabled", api.is_history_enabled);
  resolve(lib, "reservoir_torch_snapshot", api.snapshot);
  resolve(lib, "reservoir_torch_buffer_free", api.buffer_free);
  resolve(lib, "reservoir_torch_attach_trace_tracker", api.attach_trace_tracker);
  resolve(lib, "reservoir_torch_expandable_segment_sizes", api.expandable_segment_sizes);
  resolve(lib, "reservoir_torch_checkpoint_pool", api.checkpoint_pool);
  resolve(lib, "reservoir_torch_checkpoint_free", api.checkpoint_free);
  resolve(lib, "reservoir_torch_restore_checkpoint", api.restore_checkpoint);
  resolve(lib, "reservoir_torch_u64s_free", api.u64s_free);
  resolve(lib, "reservoir_torch_set_allocator_settings", api.set_allocator_settings);
  resolve(lib, "reservoir_torch_set_no_split", api.set_no_split);
  resolve(lib, "reservoir_torch_set_use_on_oom", api.set_use_on_oom);
  resolve(lib, "reservoir_last_error", api.last_error);
  resolve(lib, "reservoir_status_name", api.status_name);
  api_loaded = true;
}

// A failed Reservoir call as a torch error: "reservoir: STATUS: message".
void check(int status) {
  if (status == kOk) return;
  TORCH_CHECK(false, "reservoir: ", api.status_name(status), ": ", api.last_error());
}

[[noreturn]] void unsupported(const char* method, const char* why) {
  TORCH_CHECK(false, "reservoir: ", method, " is not supported: ", why);
  throw; // unreachable: TORCH_CHECK(false) throws
}

// ---- CUDA runtime calls (resolved in the libcudart torch loaded) -----------

void* cudart(const char* name) {
  static void* lib = [] {
    for (const char* so : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
      if (void* h = dlopen(so, RTLD_NOW | RTLD_NOLOAD)) return h;
    }
    return static_cast<void*>(RTLD_DEFAULT);
  }();
  void* sym = dlsym(lib, name);
  TORCH_CHECK(sym != nullptr, "reservoir: the CUDA runtime torch loaded has no ", name);
  return sym;
}

// ---- contexts (stacks) recorded through torch's context recorder ------------

std::mutex ctx_mutex;
std::atomic<CreateContextFn> ctx_recorder{nullptr};
std::unordered_map<uint64_t, std::shared_ptr<c10::GatheredContext>> contexts;
uint64_t next_ctx = 1;

extern "C" uint64_t record_context() {
  CreateContextFn fn = ctx_recorder.load();
  if (fn == nullptr) return 0;
  std::shared_ptr<c10::GatheredContext> ctx = fn();
  if (!ctx) return 0;
  std::lock_guard<std::mutex> g(ctx_mutex);
  uint64_t id = next_ctx++;
  contexts.emplace(id, std::move(ctx));
  return id;
}

std::shared_ptr<c10::GatheredContext> context(uint64_t id) {
  if (id == 0) return nullptr;
  std::lock_guard<std::mutex> g(ctx_mutex);
  auto it = contexts.find(id);
  return it == contexts.end() ? nullptr : it->second;
}

// ---- Reservoir's microseconds since the epoch as torch's approximate clock ----

struct Clock {
  c10::approx_time_t a0;
  double t0;
  double ns_per_tick;
  Clock() {
    c10::ApproximateClockToUnixTimeConverter clock;
    auto to_ns = clock.makeConverter();
    a0 = c10::getApproximateTime();
    auto span = static_cast<c10::approx_time_t>(1000000000);
    t0 = static_cast<double>(to_ns(a0));
    ns_per_tick = (static_cast<double>(to_ns(a0 + span)) - t0) / static_cast<double>(span);
    if (!(ns_per_tick > 0)) ns_per_tick = 1.0;
  }
  c10::approx_time_t at(int64_t time_us) const {
    double ticks = (static_cast<double>(time_us) * 1000.0 - t0) / ns_per_tick;
    return a0 + static_cast<c10::approx_time_t>(ticks);
  }
};

// ---- checkpoints ---------------------------------------------------------------

struct ReservoirCheckpoint final : AllocatorState {
  void* ckpt;
  c10::DeviceIndex device;
  ReservoirCheckpoint(void* c, c10::DeviceIndex d) : ckpt(c), device(d) {}
  ~ReservoirCheckpoint() override { api.checkpoint_free(ckpt); }
};

// ---- the allocator -----------------------------------------------------------

void free_block(void* ptr);
void trace_free(void* ptr);

class ReservoirAllocator final : public CUDAAllocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    void* ptr = alloc(n, device, c10::cuda::getCurrentCUDAStream(device).stream());
    return {ptr, ptr, &free_block, c10::Device(c10::DeviceType::CUDA, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_block; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    using Fn = int (*)(void*, const void*, size_t, int);
    auto memcpy_fn = reinterpret_cast<Fn>(cudart("cudaMemcpy"));
    C10_CUDA_CHECK(static_cast<cudaError_t>(memcpy_fn(dest, src, count, 3 /* DeviceToDevice */)));
  }

  void* raw_alloc(size_t nbytes) override {
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return alloc(nbytes, device, c10::cuda::getCurrentCUDAStream(device).stream());
  }

  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return alloc(nbytes, device, stream);
  }

  void raw_delete(void* ptr) override {
    trace_free(ptr);
    check(api.del(ptr));
  }

  void init(int device_count) override { device_count_ = device_count; initialized_ = true; }

  bool initialized() override { return initialized_; }

  double getMemoryFraction(c10::DeviceIndex device) override {
    double f = 1.0;
    check(api.fraction(device, &f));
    return f;
  }

  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    check(api.set_fraction(device, fraction));
  }

  std::vector<StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex device) override {
    size_t n = 0;
    check(api.expandable_segment_sizes(device, nullptr, 0, &n));
    std::vector<StreamSegmentSizeC> v(n);
    size_t m = 0;
    check(api.expandable_segment_sizes(device, v.data(), v.size(), &m));
    std::vector<StreamSegmentSize> out;
    for (size_t i = 0; i < std::min(n, m); i++) {
      out.emplace_back(reinterpret_cast<cudaStream_t>(v[i].stream), v[i].is_small_pool, v[i].total_size);
    }
    return out;
  }

  void enable(bool value) override {
    if (!value) unsupported("enable(false)", "Reservoir cannot be switched off once installed");
  }

  bool isEnabled() const override { return true; }

  void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override {
    uint64_t v = 0;
    check(api.cache_info(device, &v));
    *largestBlock = static_cast<size_t>(v);
  }

  void* getBaseAllocation(void* ptr, size_t* size) override {
    void* base = nullptr;
    uint64_t s = 0;
    check(api.base_allocation(ptr, &base, &s));
    if (size != nullptr) *size = static_cast<size_t>(s);
    return base;
  }

  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    // As torch's allocator: memory it did not hand out is not its to track.
    if (ptr.get() == nullptr || ptr.get_deleter() != &free_block) return;
    check(api.record_stream(ptr.get(), stream.stream()));
  }

  void emptyCache(c10::MempoolId_t id) override { check(api.empty_cache_pool(id.first, id.second)); }

  cda::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    std::vector<int64_t> v(kStatsLen);
    check(api.device_stats(device, v.data(), v.size()));
    cda::DeviceStats s;
    size_t i = 0;
    auto stat = [&](c10::CachingAllocator::Stat& st) {
      st.current = v[i++];
      st.peak = v[i++];
      st.allocated = v[i++];
      st.freed = v[i++];
    };
    for (auto* arr : {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
                      &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes}) {
      for (auto& st : *arr) stat(st);
    }
    s.num_alloc_retries = v[i++];
    s.num_ooms = v[i++];
    stat(s.oversize_allocations);
    stat(s.oversize_segments);
    s.num_sync_all_streams = v[i++];
    s.num_device_alloc = v[i++];
    s.num_device_free = v[i++];
#if RESERVOIR_TORCH_AT_LEAST(12)
    s.num_oom_rejections = v[i];
#endif
    i++;
    s.max_split_size = v[i++];
#if RESERVOIR_TORCH_AT_LEAST(13)
    // One entry per private pool that ever held memory (spec 1.12). Pools
    // may appear between the count and the copy: ask again, larger.
    std::vector<int64_t> p;
    size_t pools = 0;
    check(api.private_pool_stats(device, nullptr, 0, &pools));
    for (;;) {
      p.assign((pools + 4) * kPrivatePoolStatsLen, 0);
      int status = api.private_pool_stats(device, p.data(), p.size(), &pools);
      if (status == kOk) break;
      if (pools * kPrivatePoolStatsLen <= p.size()) check(status);
    }
    for (size_t k = 0; k < pools; k++) {
      i = k * kPrivatePoolStatsLen;
      c10::MempoolId_t id{static_cast<c10::CaptureId_t>(p[i]),
                          static_cast<c10::CaptureId_t>(p[i + 1])};
      i += 2;
      for (auto& st : s.reserved_bytes_by_private_pools[id]) {
        st.current = p[i++];
        st.peak = p[i++];
        st.allocated = p[i++];
        st.freed = p[i++];
      }
    }
#endif
    return s;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override { check(api.reset_accumulated(device)); }

  void resetPeakStats(c10::DeviceIndex device) override { check(api.reset_peak(device)); }

  SnapshotInfo snapshot(c10::MempoolId_t id, bool include_traces) override;

  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id,
                           std::function<bool(cudaStream_t)> filter) override {
    auto* owned = new std::function<bool(cudaStream_t)>(std::move(filter));
    check(api.begin_pool(
        device, id.first, id.second,
        [](void* ctx, void* stream) -> bool {
          return (*static_cast<std::function<bool(cudaStream_t)>*>(ctx))(static_cast<cudaStream_t>(stream));
        },
        owned, [](void* ctx) { delete static_cast<std::function<bool(cudaStream_t)>*>(ctx); }));
  }

  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id) override {
    check(api.end_pool(device, id.first, id.second));
  }

  void releasePool(c10::DeviceIndex device, c10::MempoolId_t id) override {
    check(api.release_pool(device, id.first, id.second));
  }

  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t id) override {
    uint32_t n = 0;
    check(api.pool_use_count(device, id.first, id.second, &n));
    return static_cast<int>(n);
  }

  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t id,
                          std::shared_ptr<CUDAAllocator> allocator) override {
    if (allocator && allocator.get() != this) {
      // MemPool(allocator=CUDAPluggableAllocator(...)): the pool's segments
      // come from that allocator (raw_alloc_with_stream / raw_delete, which
      // call its alloc and free functions), its blocks are cached by
      // Reservoir. The pool holds the allocator until its last segment is
      // given back (as torch's PrivatePool does).
      using Owned = std::shared_ptr<CUDAAllocator>;
      auto* owned = new Owned(std::move(allocator));
      check(api.create_pool_with_allocator(
          device, id.first, id.second,
          [](void* ctx, uint64_t size, int32_t dev, void* stream) -> void* {
            try {
              c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(dev));
              return (*static_cast<Owned*>(ctx))
                  ->raw_alloc_with_stream(static_cast<size_t>(size), static_cast<cudaStream_t>(stream));
            } catch (...) {
              return nullptr;  // out of memory for Reservoir (never unwinds into Rust)
            }
          },
          [](void* ctx, void* ptr, uint64_t, int32_t dev, void*) {
            try {
              c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(dev));
              (*static_cast<Owned*>(ctx))->raw_delete(ptr);
            } catch (...) {
            }
          },
          owned, [](void* ctx) { delete static_cast<Owned*>(ctx); }));
      return;
    }
    check(api.create_or_incref_pool(device, id.first, id.second));
  }

  // MemPool(use_on_oom=True): an allocation outside every pool that would
  // run out of memory takes a free block of this pool first (spec 1.5).
  // torch's ~MemPool unmarks the pool while unwinding it: unmarking never
  // fails in Reservoir (raising there would end the process).
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t id, bool use_on_oom) override {
    check(api.set_use_on_oom(device, id.first, id.second, use_on_oom ? 1 : 0));
  }

  void setNoSplit(c10::DeviceIndex device, c10::MempoolId_t id) override {
    check(api.set_no_split(device, id.first, id.second));
  }

  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t id,
                                const std::unordered_set<void*>& expected) override {
    std::vector<uint64_t> v;
    v.reserve(expected.size());
    for (void* p : expected) v.push_back(reinterpret_cast<uint64_t>(p));
    bool ok = false;
    check(api.check_pool_live(device, id.first, id.second, v.data(), v.size(), &ok));
    return ok;
  }

  ShareableHandle shareIpcHandle(void*) override {
    unsupported("shareIpcHandle", "Reservoir's C ABI does not export CUDA IPC handles yet");
  }

  std::shared_ptr<void> getIpcDevPtr(std::string) override {
    unsupported("getIpcDevPtr", "Reservoir's C ABI does not open CUDA IPC handles yet");
  }

  bool isHistoryEnabled() override {
    bool on = false;
    check(api.is_history_enabled(&on));
    return on;
  }

  void recordHistory(bool enabled, CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                     RecordContext when, bool clearHistory,
                     const std::vector<std::string>& skip_actions) override {
    if (!skip_actions.empty()) {
      unsupported("recordHistory(skip_actions)", "Reservoir records every trace action");
    }
    // torch passes enabled="state" as a max_entries of 0 trace entries.
    bool trace_all = enabled && alloc_trace_max_entries > 0;
    size_t max_entries = alloc_trace_max_entries > 0 ? alloc_trace_max_entries : 1;
    ctx_recorder.store(enabled ? context_recorder : nullptr);
    {
      std::lock_guard<std::mutex> g(annotations_mutex_);
      annotations_on_ = enabled;
      annotations_max_ = max_entries;
      if (clearHistory) annotations_.clear();
    }
    check(api.record_history(enabled, trace_all, enabled && context_recorder ? &record_context : nullptr,
                             max_entries, enabled ? static_cast<int32_t>(when) : 0, clearHistory));
  }

  // record_function scopes while history is on: kept here, given back as
  // the snapshot's external_annotations (as torch's allocator keeps them).
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override {
    std::lock_guard<std::mutex> g(annotations_mutex_);
    if (!annotations_on_) return;
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    cda::AnnotationEntry ae(device, c10::getApproximateTime());
    for (const auto& kv : md) ae.recordUserMetadata(kv.first, kv.second);
    if (annotations_.size() >= annotations_max_) annotations_.erase(annotations_.begin());
    annotations_.push_back(std::move(ae));
  }

  void pushCompileContext(std::string&) override {
    unsupported("pushCompileContext", "Reservoir's trace entries do not carry torch.compile contexts yet");
  }

  void popCompileContext() override {
    unsupported("popCompileContext", "Reservoir's trace entries do not carry torch.compile contexts yet");
  }

  // markCaptureBegin / markCaptureEnd keep torch's default (nothing to do):
  // Reservoir routes a capture's allocations by the beginAllocateToPool
  // filter and needs no other notice of the capture.

  void attachOutOfMemoryObserver(OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> g(observers_mutex_);
    oom_observers_.push_back(std::move(observer));
  }

#if RESERVOIR_TORCH_AT_LEAST(12)
  void attachOomRejectionObserver(OomRejectionObserver) override {
    unsupported("attachOomRejectionObserver",
                "Reservoir never rejects an allocation before trying it (no throw_on_cudamalloc_oom policy)");
  }
#endif

  void attachAllocatorTraceTracker(AllocatorTraceTracker tracker) override {
    // Lives as long as the process, as torch's trackers do.
    auto* t = new std::pair<AllocatorTraceTracker, Clock>(std::move(tracker), Clock());
    check(api.attach_trace_tracker(
        [](void* ctx, int32_t device, int32_t action, uint64_t addr, uint64_t size, void* stream, uint64_t p0,
           uint64_t p1, int64_t time_us) {
          auto* t = static_cast<std::pair<AllocatorTraceTracker, Clock>*>(ctx);
          cda::TraceEntry te(static_cast<cda::TraceEntry::Action>(action), static_cast<c10::DeviceIndex>(device),
                             addr, size, stream, c10::MempoolId_t{p0, p1}, t->second.at(time_us));
          t->first(te);
        },
        t));
  }

  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    c10::cuda::CUDAGuard guard(dev);
    using Fn = int (*)(int, unsigned);
    auto fn = reinterpret_cast<Fn>(cudart("cudaDeviceEnablePeerAccess"));
    int err = fn(dev_to_access, 0);
    if (err == 704 /* cudaErrorPeerAccessAlreadyEnabled */) {
      reinterpret_cast<int (*)()>(cudart("cudaGetLastError"))();
      return;
    }
    C10_CUDA_CHECK(static_cast<cudaError_t>(err));
  }

  cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override {
    if (p2p_enabled || dstDevice == srcDevice) {
      using Fn = cudaError_t (*)(void*, const void*, size_t, int, cudaStream_t);
      return reinterpret_cast<Fn>(cudart("cudaMemcpyAsync"))(dst, src, count, 3, stream);
    }
    using Fn = cudaError_t (*)(void*, int, const void*, int, size_t, cudaStream_t);
    return reinterpret_cast<Fn>(cudart("cudaMemcpyPeerAsync"))(dst, dstDevice, src, srcDevice, count, stream);
  }

  std::shared_ptr<AllocatorState> getCheckpointState(c10::DeviceIndex device, c10::MempoolId_t id) override {
    void* ckpt = nullptr;
    check(api.checkpoint_pool(device, id.first, id.second, &ckpt));
    return std::make_shared<ReservoirCheckpoint>(ckpt, device);
  }

  CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device, std::shared_ptr<AllocatorState> pps) override {
    auto* c = dynamic_cast<ReservoirCheckpoint*>(pps.get());
    TORCH_CHECK(c != nullptr, "reservoir: setCheckpointPoolState: the state is not a Reservoir checkpoint");
    TORCH_CHECK(c->device == device, "reservoir: setCheckpointPoolState: the checkpoint is of device ",
                static_cast<int>(c->device), ", not ", static_cast<int>(device));
    uint64_t *freed = nullptr, *made = nullptr;
    size_t nfreed = 0, nmade = 0;
    check(api.restore_checkpoint(c->ckpt, &freed, &nfreed, &made, &nmade));
    CheckpointDelta d;
    for (size_t i = 0; i < nfreed; i++) d.ptrs_freed.push_back(reinterpret_cast<void*>(freed[i]));
    for (size_t i = 0; i < nmade; i++) {
      void* p = reinterpret_cast<void*>(made[i]);
      d.dataptrs_allocd.emplace_back(p, p, &free_block, c10::Device(c10::DeviceType::CUDA, device));
    }
    api.u64s_free(freed, nfreed);
    api.u64s_free(made, nmade);
    return d;
  }

  std::string name() override { return "reservoir"; }

 private:
  void* alloc(size_t n, c10::DeviceIndex device, cudaStream_t stream) {
    void* ptr = nullptr;
    char msg[4096];
    ReservoirTorchOom oom{0, 0, 0, msg, sizeof(msg), 0};
    int status = api.malloc(n, device, stream, &ptr, &oom);
    if (status == kOutOfMemory) {
      std::vector<OutOfMemoryObserver> observers;
      {
        std::lock_guard<std::mutex> g(observers_mutex_);
        observers = oom_observers_;
      }
      for (const auto& obs : observers) obs(device, oom.alloc_size, oom.device_total, oom.device_free);
      TORCH_CHECK_WITH(OutOfMemoryError, false, std::string(msg));
    }
    check(status);
    // torch's GPU trace hooks (torch.cuda._gpu_trace, the CUDA Sanitizer),
    // called where the native allocator calls them: after each allocation
    // of a non-null block.
    if (ptr != nullptr) {
      if (const c10::impl::PyInterpreter* interp = c10::impl::GPUTrace::get_trace(); C10_UNLIKELY(interp)) {
        (*interp)->trace_gpu_memory_allocation(c10::kCUDA, reinterpret_cast<uintptr_t>(ptr));
      }
    }
    return ptr;
  }

  std::mutex annotations_mutex_;
  bool annotations_on_ = false;
  size_t annotations_max_ = 0;
  std::vector<cda::AnnotationEntry> annotations_;
  int device_count_ = 0;
  bool initialized_ = false;
  std::mutex observers_mutex_;
  std::vector<OutOfMemoryObserver> oom_observers_;
};

// torch's GPU trace hook for a free, called before the block is returned
// (as the native allocator does); nothing for null.
void trace_free(void* ptr) {
  if (ptr == nullptr) return;
  if (const c10::impl::PyInterpreter* interp = c10::impl::GPUTrace::get_trace(); C10_UNLIKELY(interp)) {
    (*interp)->trace_gpu_memory_deallocation(c10::kCUDA, reinterpret_cast<uintptr_t>(ptr));
  }
}

void free_block(void* ptr) {
  trace_free(ptr);
  int status = api.del(ptr);
  if (status != kOk) {
    TORCH_WARN("reservoir: freeing ", ptr, " failed: ", api.status_name(status), ": ", api.last_error());
  }
}

// Reservoir's text snapshot (reservoir_torch_snapshot) as torch's SnapshotInfo.
SnapshotInfo ReservoirAllocator::snapshot(c10::MempoolId_t id, bool include_traces) {
  uint8_t* buf = nullptr;
  size_t len = 0;
  check(api.snapshot(id.first, id.second, include_traces, &buf, &len));
  std::string text(reinterpret_cast<const char*>(buf), len);
  api.buffer_free(buf, len);

  Clock clock;

  SnapshotInfo out;
  std::unordered_set<uint64_t> used;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::istringstream f(line.substr(2));
    switch (line[0]) {
      case 'S': {
        cda::SegmentInfo s;
        int device = 0, is_large = 0, expandable = 0;
        uint64_t stream = 0, p0 = 0, p1 = 0, ctx = 0;
        size_t nblocks = 0;
        f >> device >> s.address >> s.total_size >> s.allocated_size >> s.active_size >> s.requested_size >>
            stream >> is_large >> expandable >> p0 >> p1 >> ctx >> nblocks;
        s.device = static_cast<c10::DeviceIndex>(device);
        s.stream = reinterpret_cast<void*>(stream);
        s.is_large = is_large != 0;
        s.is_expandable = expandable != 0;
        s.owner_private_pool_id = {p0, p1};
        s.context_when_allocated = context(ctx);
        used.insert(ctx);
        out.segments.push_back(std::move(s));
        break;
      }
      case 'B': {
        TORCH_CHECK(!out.segments.empty(), "reservoir: snapshot text has a block before any segment");
        cda::BlockInfo b;
        int state = 0;
        uint64_t ctx = 0;
        f >> b.size >> b.requested_size >> state >> ctx;
        b.allocated = state == 2;
        b.active = state != 0;
        b.context_when_allocated = context(ctx);
        used.insert(ctx);
        out.segments.back().blocks.push_back(std::move(b));
        break;
      }
      case 'T': {
        int device = 0, action = 0;
        uint64_t addr = 0, size = 0, stream = 0, p0 = 0, p1 = 0, ctx = 0;
        int64_t time_us = 0;
        f >> device >> action >> addr >> size >> stream >> p0 >> p1 >> time_us >> ctx;
        if (out.device_traces.size() <= static_cast<size_t>(device)) out.device_traces.resize(device + 1);
        auto when = clock.at(time_us);
        used.insert(ctx);
        out.device_traces[device].emplace_back(static_cast<cda::TraceEntry::Action>(action),
                                               static_cast<c10::DeviceIndex>(device), addr, size,
                                               reinterpret_cast<void*>(stream), c10::MempoolId_t{p0, p1}, when,
                                               context(ctx));
        break;
      }
      case 'C': {
        auto& c = out.config_metadata;
        int64_t max_split = -1, max_round = -1, max_cached = -1;
        int expandable = 0, release_lock = 0, host_reg = 0, rs_reuse = 0;
        size_t n = 0;
        f >> max_split >> c.garbage_collection_threshold >> expandable >> c.pinned_num_register_threads >>
            release_lock >> host_reg >> rs_reuse >> max_round >> max_cached >> n;
        c.max_split_size = static_cast<size_t>(max_split);
        c.expandable_segments = expandable != 0;
        c.release_lock_on_malloc = release_lock != 0;
        c.pinned_use_host_register = host_reg != 0;
        c.graph_capture_record_stream_reuse = rs_reuse != 0;
#if RESERVOIR_TORCH_AT_LEAST(13)
        c.max_round_threshold = static_cast<size_t>(max_round);
        c.max_cached_size = static_cast<size_t>(max_cached);
#endif
        c.roundup_power2_divisions.assign(n, 0);
        for (size_t k = 0; k < n; k++) f >> c.roundup_power2_divisions[k];
        break;
      }
      case 'L':
        out.config_metadata.last_allocator_settings = line.size() > 2 ? line.substr(2) : "";
        break;
      default:
        TORCH_CHECK(false, "reservoir: unknown snapshot record: ", line);
    }
  }
  if (include_traces) {
    std::lock_guard<std::mutex> g(annotations_mutex_);
    out.external_annotations = annotations_;
  }
  // Forget the stacks nothing can show again: what is not in this snapshot
  // (blocks freed, trace entries out of the ring) never comes back.
  if (include_traces && id == c10::MempoolId_t{0, 0}) {
    std::lock_guard<std::mutex> g(ctx_mutex);
    for (auto it = contexts.begin(); it != contexts.end();) {
      it = used.count(it->first) ? std::next(it) : contexts.erase(it);
    }
  }
  return out;
}

std::shared_ptr<ReservoirAllocator> the_allocator;

std::shared_ptr<CUDAAllocator> make(const std::string& native_path) {
  load_api(native_path);
  if (!the_allocator) the_allocator = std::make_shared<ReservoirAllocator>();
  return the_allocator;
}

// What change_current_allocator does not do, done once Reservoir is torch's
// CUDA allocator (reservoir.torch.enable()):
// - torch's device-generic registry (c10::GetAllocator(kCUDA), which
//   torch.accelerator.memory_stats / memory_allocated / empty_cache and
//   c10::getDeviceAllocator read) points at Reservoir, not at the native
//   allocator it still names;
// - torch.cuda.memory._set_allocator_settings (c10::CachingAllocator::
//   setAllocatorSettings) reaches Reservoir: torch parses the string first
//   (its own errors come first, as natively), then its device hook runs,
//   then Reservoir applies it at run time to every device (spec 1.17's
//   run-time rules), or raises naming what it refuses; never ignored.
bool installed = false;
void install() {
  TORCH_CHECK(the_allocator, "reservoir: install() before allocator()");
  if (installed) return;
  c10::SetAllocator(c10::DeviceType::CUDA, the_allocator.get(), /*priority=*/UINT8_MAX);
  auto& hook = c10::CachingAllocator::AcceleratorAllocatorConfig::getConfigParserHook();
  std::function<void(const std::string&)> torch_hook = hook;
  hook = [torch_hook](const std::string& env) {
    if (torch_hook) torch_hook(env);
    check(api.set_allocator_settings(env.c_str()));
  };
  installed = true;
}

}  // namespace reservoir_face

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Reservoir's CUDAAllocator for torch (reservoir.torch)";
  m.def("allocator", &reservoir_face::make, py::arg("native_path"),
        "The Reservoir CUDAAllocator (one per process), as torch._C._cuda_CUDAAllocator; "
        "native_path is reservoir._native's file, whose C entry points it calls.");
  m.def("install", &reservoir_face::install,
        "After change_current_allocator: torch's device-generic registry and its run-time "
        "settings hook reach Reservoir too.");
  m.def("torch_version", [] { return std::string(TORCH_VERSION); });
}
