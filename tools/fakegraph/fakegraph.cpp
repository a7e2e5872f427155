// fakegraph: CUDA stream capture for the fake CUDA device of ../shared/oracle
// (issue 40, item 3).
//
// The fake runtime (libcudart.so.13 of ../shared/oracle) refuses graph
// capture (cudaErrorNotSupported), so none of PyTorch's CUDA-graph memory
// tests could run on it: private pools, graph_pool_handle() sharing,
// make_graphed_callables, checkpoint/restore, checkPoolLiveAllocations.
// What those tests exercise is the allocator, not the GPU, so this layer
// gives capture the semantics an allocator can observe, and nothing more:
//
//   * cudaStreamBeginCapture / cudaStreamEndCapture track capture per
//     stream: status (none / active / invalidated), a unique capture id
//     (1, 2, ...; never reused), the mode and the graph being built.
//     cudaStreamIsCapturing and cudaStreamGetCaptureInfo report it
//     truthfully (no dependency nodes are reported).
//   * Work launched into a capturing stream (kernel launches, async memcpy
//     and memset, host functions, event records) is recorded as a node
//     count and NOT executed, as on a GPU. Replaying the graph
//     (cudaGraphLaunch) executes nothing: kernels on the fake device compute
//     nothing anyway, and copies are not replayed (they would write memory
//     the allocator may have handed on; see README.md).
//   * Cross-stream capture: an event recorded in a capturing stream, waited
//     on by another stream, makes that stream join the capture (same id,
//     same graph); ending the capture on its origin stream ends it for every
//     stream that joined. (Unjoined streams are not reported as an error.)
//   * cudaStreamSynchronize / cudaStreamQuery on a capturing stream fail with
//     cudaErrorStreamCaptureUnsupported and invalidate the capture (as on a
//     GPU); cudaStreamEndCapture then fails with
//     cudaErrorStreamCaptureInvalidated.
//   * cudaThreadExchangeStreamCaptureMode swaps a per-thread mode.
//   * Graphs, executable graphs and user objects are small host objects:
//     cudaGraphInstantiate(WithFlags), cudaGraphUpload, cudaGraphLaunch,
//     cudaGraphGetNodes (the recorded node count), cudaGraphDestroy,
//     cudaGraphExecDestroy, cudaGraphDebugDotPrint, cudaUserObjectCreate,
//     cudaGraphRetainUserObject, cudaUserObjectRelease (destructors run
//     when the last reference goes, on the calling thread).
//
// Everything else, and every call on a stream that is not capturing, goes to
// the fake runtime unchanged (dlvsym(RTLD_NEXT, ...)). The library must be
// loaded BEFORE the fake libcudart.so.13: first in LD_PRELOAD. Its symbols
// carry the version `libcudart.so.13` (fakegraph.map), as torch's references
// do, so the dynamic linker binds torch to them.
//
// Hooks for tests: fakegraph_is_loaded() returns 1; fakegraph_stat(name)
// returns "captures_begun", "captures_ended", "captures_invalidated",
// "graphs_live", "execs_live", "launches", "nodes_recorded".
// FAKEGRAPH_LOG=1 prints each capture call on stderr.
//
// Built by tools/fakegraph/build.sh (no network: the CUDA headers are those
// the oracle's build-driver.sh already unpacked).

#include <cuda_runtime_api.h>

#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

namespace {

constexpr const char* kVersion = "libcudart.so.13";

struct Graph;

struct UserObject {
  void* ptr;
  cudaHostFn_t destroy;
  long refs;
};

struct Graph {
  unsigned long long capture_id;
  size_t nodes;
  std::vector<std::pair<UserObject*, unsigned int>> user_objects;  // (object, references held)
};

struct Exec {
  size_t nodes;
  std::vector<std::pair<UserObject*, unsigned int>> user_objects;  // inherited from the graph, as on a GPU
};

struct Capture {
  unsigned long long id;
  cudaStreamCaptureStatus status;
  cudaStreamCaptureMode mode;
  cudaStream_t origin;
  Graph* graph;
};

std::mutex mu;
std::unordered_map<cudaStream_t, Capture*> by_stream;  // streams in a capture (origin and joined)
std::unordered_map<cudaEvent_t, unsigned long long> capture_events;  // event -> capture id it was recorded in
std::unordered_map<unsigned long long, Capture*> live;  // capture id -> capture, until EndCapture
std::set<Graph*> graphs;
std::set<Exec*> execs;
std::set<UserObject*> user_objects;
unsigned long long next_id = 1;
thread_local cudaStreamCaptureMode thread_mode = cudaStreamCaptureModeGlobal;

std::atomic<long> st_begun{0}, st_ended{0}, st_invalidated{0}, st_launches{0}, st_nodes{0};

bool log_on() {
  static int on = [] {
    const char* v = getenv("FAKEGRAPH_LOG");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }();
  return on != 0;
}

#define LOG(...)                                 \
  do {                                           \
    if (log_on()) {                              \
      fprintf(stderr, "[fakegraph] " __VA_ARGS__); \
      fputc('\n', stderr);                       \
    }                                            \
  } while (0)

// The fake runtime's function of that name (the next definition after this
// library in the lookup order).
void* next_fn(const char* name) {
  void* f = dlvsym(RTLD_NEXT, name, kVersion);
  if (f == nullptr) f = dlsym(RTLD_NEXT, name);
  if (f == nullptr) {
    fprintf(stderr, "[fakegraph] fatal: %s not found after this library: load libfakegraph.so before the fake libcudart.so.13\n",
            name);
    abort();
  }
  return f;
}

#define NEXT(name) reinterpret_cast<decltype(&name)>(next_fn(#name))

// The capture `s` is in, or null. Caller holds `mu`.
Capture* capture_of(cudaStream_t s) {
  if (by_stream.empty()) return nullptr;
  auto it = by_stream.find(s);
  return it == by_stream.end() ? nullptr : it->second;
}

// Records one node if `s` is capturing: true when the call must not execute.
bool record_node(cudaStream_t s) {
  std::lock_guard<std::mutex> g(mu);
  Capture* c = capture_of(s);
  if (c == nullptr) return false;
  if (c->status == cudaStreamCaptureStatusActive) {
    c->graph->nodes++;
    st_nodes++;
  }
  return true;
}

void release_user_object(UserObject* o, unsigned int count) {
  bool last = false;
  {
    std::lock_guard<std::mutex> g(mu);
    if (user_objects.count(o) == 0) return;
    o->refs -= count;
    if (o->refs <= 0) {
      user_objects.erase(o);
      last = true;
    }
  }
  if (last) {
    if (o->destroy != nullptr) o->destroy(o->ptr);
    delete o;
  }
}

}  // namespace

extern "C" {

// ---- capture ----

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
  std::lock_guard<std::mutex> g(mu);
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) {
    LOG("cudaStreamBeginCapture(%p): the default stream cannot be captured", (void*)s);
    return cudaErrorStreamCaptureUnsupported;
  }
  if (capture_of(s) != nullptr) {
    LOG("cudaStreamBeginCapture(%p): already capturing", (void*)s);
    return cudaErrorIllegalState;
  }
  auto* c = new Capture{next_id++, cudaStreamCaptureStatusActive, mode, s, new Graph{0, 0, {}}};
  c->graph->capture_id = c->id;
  by_stream[s] = c;
  live[c->id] = c;
  st_begun++;
  LOG("cudaStreamBeginCapture(%p, mode %d): capture %llu", (void*)s, (int)mode, c->id);
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* out) {
  std::lock_guard<std::mutex> g(mu);
  Capture* c = capture_of(s);
  if (c == nullptr) {
    LOG("cudaStreamEndCapture(%p): not capturing", (void*)s);
    return cudaErrorIllegalState;
  }
  if (c->origin != s) {
    LOG("cudaStreamEndCapture(%p): not the origin stream of capture %llu", (void*)s, c->id);
    return cudaErrorStreamCaptureUnmatched;
  }
  for (auto it = by_stream.begin(); it != by_stream.end();) {
    if (it->second == c) {
      it = by_stream.erase(it);
    } else {
      ++it;
    }
  }
  live.erase(c->id);
  bool valid = c->status == cudaStreamCaptureStatusActive;
  LOG("cudaStreamEndCapture(%p): capture %llu, %zu nodes%s", (void*)s, c->id, c->graph->nodes,
      valid ? "" : " (invalidated)");
  if (!valid) {
    delete c->graph;
    delete c;
    if (out != nullptr) *out = nullptr;
    return cudaErrorStreamCaptureInvalidated;
  }
  graphs.insert(c->graph);
  if (out != nullptr) *out = reinterpret_cast<cudaGraph_t>(c->graph);
  delete c;
  st_ended++;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus* st) {
  std::lock_guard<std::mutex> g(mu);
  Capture* c = capture_of(s);
  if (st != nullptr) *st = c == nullptr ? cudaStreamCaptureStatusNone : c->status;
  return cudaSuccess;
}

cudaError_t cudaStreamGetCaptureInfo(cudaStream_t s, enum cudaStreamCaptureStatus* st, unsigned long long* id,
                                     cudaGraph_t* graph, const cudaGraphNode_t** deps, const cudaGraphEdgeData** edges,
                                     size_t* ndeps) {
  std::lock_guard<std::mutex> g(mu);
  Capture* c = capture_of(s);
  if (st != nullptr) *st = c == nullptr ? cudaStreamCaptureStatusNone : c->status;
  if (c != nullptr && c->status == cudaStreamCaptureStatusActive) {
    if (id != nullptr) *id = c->id;
    if (graph != nullptr) *graph = reinterpret_cast<cudaGraph_t>(c->graph);
  } else {
    if (id != nullptr) *id = 0;
    if (graph != nullptr) *graph = nullptr;
  }
  // No dependency nodes are modelled.
  if (deps != nullptr) *deps = nullptr;
  if (edges != nullptr) *edges = nullptr;
  if (ndeps != nullptr) *ndeps = 0;
  return cudaSuccess;
}

cudaError_t cudaStreamUpdateCaptureDependencies(cudaStream_t s, cudaGraphNode_t*, const cudaGraphEdgeData*, size_t,
                                                unsigned int) {
  std::lock_guard<std::mutex> g(mu);
  return capture_of(s) == nullptr ? cudaErrorIllegalState : cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode* mode) {
  if (mode == nullptr) return cudaErrorInvalidValue;
  cudaStreamCaptureMode old = thread_mode;
  thread_mode = *mode;
  *mode = old;
  return cudaSuccess;
}

// ---- work on a capturing stream: recorded, not executed ----

cudaError_t __cudaLaunchKernel(cudaKernel_t k, dim3 grid, dim3 block, void** args, size_t shmem, cudaStream_t s) {
  if (record_node(s)) return cudaSuccess;
  static auto next = NEXT(__cudaLaunchKernel);
  return next(k, grid, block, args, shmem, s);
}

cudaError_t cudaLaunchKernel(const void* f, dim3 grid, dim3 block, void** args, size_t shmem, cudaStream_t s) {
  if (record_node(s)) return cudaSuccess;
  static auto next = NEXT(cudaLaunchKernel);
  return next(f, grid, block, args, shmem, s);
}

cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* c, const void* f, void** args) {
  if (c != nullptr && record_node(c->stream)) return cudaSuccess;
  static auto next = NEXT(cudaLaunchKernelExC);
  return next(c, f, args);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, enum cudaMemcpyKind k, cudaStream_t s) {
  if (record_node(s)) return cudaSuccess;
  static auto next = NEXT(cudaMemcpyAsync);
  return next(dst, src, n, k, s);
}

cudaError_t cudaMemcpyPeerAsync(void* dst, int dd, const void* src, int sd, size_t n, cudaStream_t s) {
  if (record_node(s)) return cudaSuccess;
  static auto next = NEXT(cudaMemcpyPeerAsync);
  return next(dst, dd, src, sd, n, s);
}

cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t s) {
  if (record_node(s)) return cudaSuccess;
  static auto next = NEXT(cudaMemsetAsync);
  return next(p, v, n, s);
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data) {
  if (record_node(s)) return cudaSuccess;
  static auto next = NEXT(cudaLaunchHostFunc);
  return next(s, fn, data);
}

// ---- events and stream order during capture ----

static cudaError_t record_event(cudaEvent_t e, cudaStream_t s, bool* handled) {
  std::lock_guard<std::mutex> g(mu);
  Capture* c = capture_of(s);
  if (c == nullptr) {
    // Recorded outside any capture: no longer a capture event.
    if (!capture_events.empty()) capture_events.erase(e);
    *handled = false;
    return cudaSuccess;
  }
  *handled = true;
  if (c->status != cudaStreamCaptureStatusActive) return cudaErrorStreamCaptureInvalidated;
  capture_events[e] = c->id;
  c->graph->nodes++;
  st_nodes++;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  bool handled = false;
  cudaError_t r = record_event(e, s, &handled);
  if (handled) return r;
  static auto next = NEXT(cudaEventRecord);
  return next(e, s);
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned int flags) {
  bool handled = false;
  cudaError_t r = record_event(e, s, &handled);
  if (handled) return r;
  static auto next = NEXT(cudaEventRecordWithFlags);
  return next(e, s, flags);
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  {
    std::lock_guard<std::mutex> g(mu);
    capture_events.erase(e);
  }
  static auto next = NEXT(cudaEventDestroy);
  return next(e);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  {
    std::lock_guard<std::mutex> g(mu);
    Capture* c = capture_of(s);
    auto it = capture_events.empty() ? capture_events.end() : capture_events.find(e);
    if (it != capture_events.end()) {
      auto lc = live.find(it->second);
      if (lc != live.end()) {
        Capture* cap = lc->second;
        if (c == nullptr) {
          // `s` joins the capture the event was recorded in.
          by_stream[s] = cap;
          LOG("cudaStreamWaitEvent(%p): joins capture %llu", (void*)s, cap->id);
        } else if (c != cap) {
          // Waiting in one capture on another's event: a GPU refuses it.
          c->status = cudaStreamCaptureStatusInvalidated;
          st_invalidated++;
          return cudaErrorStreamCaptureIsolation;
        }
        cap->graph->nodes++;
        st_nodes++;
        return cudaSuccess;
      }
      capture_events.erase(it);  // its capture has ended
    }
    if (c != nullptr) {
      // An event recorded outside the capture: a dependency on work before
      // the capture, nothing to wait for at replay here.
      return cudaSuccess;
    }
  }
  static auto next = NEXT(cudaStreamWaitEvent);
  return next(s, e, flags);
}

static bool invalidate_if_capturing(cudaStream_t s, const char* what) {
  std::lock_guard<std::mutex> g(mu);
  Capture* c = capture_of(s);
  if (c == nullptr) return false;
  if (c->status == cudaStreamCaptureStatusActive) {
    c->status = cudaStreamCaptureStatusInvalidated;
    st_invalidated++;
  }
  LOG("%s(%p) during capture %llu: cudaErrorStreamCaptureUnsupported, capture invalidated", what, (void*)s, c->id);
  return true;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (invalidate_if_capturing(s, "cudaStreamSynchronize")) return cudaErrorStreamCaptureUnsupported;
  static auto next = NEXT(cudaStreamSynchronize);
  return next(s);
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  if (invalidate_if_capturing(s, "cudaStreamQuery")) return cudaErrorStreamCaptureUnsupported;
  static auto next = NEXT(cudaStreamQuery);
  return next(s);
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  {
    std::lock_guard<std::mutex> g(mu);
    Capture* c = capture_of(s);
    if (c != nullptr) {
      if (c->origin == s) {
        // Destroying the origin of a capture abandons it.
        for (auto it = by_stream.begin(); it != by_stream.end();) {
          it = it->second == c ? by_stream.erase(it) : std::next(it);
        }
        live.erase(c->id);
        delete c->graph;
        delete c;
      } else {
        by_stream.erase(s);
      }
    }
  }
  static auto next = NEXT(cudaStreamDestroy);
  return next(s);
}

// ---- graphs, executable graphs, user objects ----

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* out, cudaGraph_t graph, unsigned long long) {
  std::lock_guard<std::mutex> g(mu);
  auto* gr = reinterpret_cast<Graph*>(graph);
  if (out == nullptr || graphs.count(gr) == 0) return cudaErrorInvalidValue;
  auto* x = new Exec{gr->nodes, gr->user_objects};
  for (auto& [o, n] : x->user_objects) o->refs += n;
  execs.insert(x);
  *out = reinterpret_cast<cudaGraphExec_t>(x);
  LOG("cudaGraphInstantiate(capture %llu): %zu nodes", gr->capture_id, gr->nodes);
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* out, cudaGraph_t graph, unsigned long long flags) {
  return cudaGraphInstantiateWithFlags(out, graph, flags);
}

cudaError_t cudaGraphUpload(cudaGraphExec_t exec, cudaStream_t) {
  std::lock_guard<std::mutex> g(mu);
  return execs.count(reinterpret_cast<Exec*>(exec)) ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  std::lock_guard<std::mutex> g(mu);
  if (execs.count(reinterpret_cast<Exec*>(exec)) == 0) return cudaErrorInvalidValue;
  Capture* c = capture_of(s);
  if (c != nullptr) {
    // Launching a graph into a capture adds it as one (child graph) node.
    c->graph->nodes++;
    st_nodes++;
    return cudaSuccess;
  }
  st_launches++;
  return cudaSuccess;  // replayed as no-ops (see the header comment)
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  std::vector<std::pair<UserObject*, unsigned int>> held;
  {
    std::lock_guard<std::mutex> g(mu);
    auto* x = reinterpret_cast<Exec*>(exec);
    if (execs.erase(x) == 0) return cudaErrorInvalidValue;
    held.swap(x->user_objects);
    delete x;
  }
  for (auto& [o, n] : held) release_user_object(o, n);
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  std::vector<std::pair<UserObject*, unsigned int>> held;
  {
    std::lock_guard<std::mutex> g(mu);
    auto* gr = reinterpret_cast<Graph*>(graph);
    if (graphs.erase(gr) == 0) return cudaErrorInvalidValue;
    held.swap(gr->user_objects);
    delete gr;
  }
  for (auto& [o, n] : held) release_user_object(o, n);
  return cudaSuccess;
}

cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* n) {
  std::lock_guard<std::mutex> g(mu);
  auto* gr = reinterpret_cast<Graph*>(graph);
  if (n == nullptr || graphs.count(gr) == 0) return cudaErrorInvalidValue;
  if (nodes != nullptr) {
    // Node handles are not modelled: hand out none.
    for (size_t i = 0; i < *n; i++) nodes[i] = nullptr;
    *n = 0;
    return cudaSuccess;
  }
  *n = gr->nodes;
  return cudaSuccess;
}

cudaError_t cudaGraphDebugDotPrint(cudaGraph_t graph, const char* path, unsigned int) {
  size_t nodes = 0;
  unsigned long long id = 0;
  {
    std::lock_guard<std::mutex> g(mu);
    auto* gr = reinterpret_cast<Graph*>(graph);
    if (path == nullptr || graphs.count(gr) == 0) return cudaErrorInvalidValue;
    nodes = gr->nodes;
    id = gr->capture_id;
  }
  FILE* f = fopen(path, "w");
  if (f == nullptr) return cudaErrorInvalidValue;
  fprintf(f, "digraph fakegraph_capture_%llu {\n  label=\"fakegraph: capture %llu, %zu nodes (not modelled)\";\n}\n", id,
          id, nodes);
  fclose(f);
  return cudaSuccess;
}

cudaError_t cudaUserObjectCreate(cudaUserObject_t* out, void* ptr, cudaHostFn_t destroy, unsigned int count,
                                 unsigned int) {
  if (out == nullptr || count == 0) return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> g(mu);
  auto* o = new UserObject{ptr, destroy, static_cast<long>(count)};
  user_objects.insert(o);
  *out = reinterpret_cast<cudaUserObject_t>(o);
  return cudaSuccess;
}

cudaError_t cudaUserObjectRetain(cudaUserObject_t obj, unsigned int count) {
  std::lock_guard<std::mutex> g(mu);
  auto* o = reinterpret_cast<UserObject*>(obj);
  if (user_objects.count(o) == 0) return cudaErrorInvalidValue;
  o->refs += count;
  return cudaSuccess;
}

cudaError_t cudaUserObjectRelease(cudaUserObject_t obj, unsigned int count) {
  release_user_object(reinterpret_cast<UserObject*>(obj), count);
  return cudaSuccess;
}

cudaError_t cudaGraphRetainUserObject(cudaGraph_t graph, cudaUserObject_t obj, unsigned int count, unsigned int flags) {
  std::lock_guard<std::mutex> g(mu);
  auto* gr = reinterpret_cast<Graph*>(graph);
  auto* o = reinterpret_cast<UserObject*>(obj);
  // The graph may still be capturing (torch retains into the capture's graph).
  bool known = graphs.count(gr) != 0;
  for (auto& [id, c] : live) known = known || c->graph == gr;
  if (!known || user_objects.count(o) == 0) return cudaErrorInvalidValue;
  if ((flags & cudaGraphUserObjectMove) == 0) o->refs += count;
  gr->user_objects.emplace_back(o, count);
  return cudaSuccess;
}

// ---- error texts the fake runtime does not know ----

static const char* capture_error(cudaError_t e, bool name) {
  switch (e) {
    case cudaErrorIllegalState:
      return name ? "cudaErrorIllegalState" : "operation not permitted when stream is capturing or not capturing";
    case cudaErrorStreamCaptureUnsupported:
      return name ? "cudaErrorStreamCaptureUnsupported" : "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return name ? "cudaErrorStreamCaptureInvalidated"
                  : "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnmatched:
      return name ? "cudaErrorStreamCaptureUnmatched" : "capture was not initiated in this stream";
    case cudaErrorStreamCaptureIsolation:
      return name ? "cudaErrorStreamCaptureIsolation"
                  : "operation would make the legacy stream depend on a capturing blocking stream";
    default:
      return nullptr;
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  if (const char* t = capture_error(e, false)) return t;
  static auto next = NEXT(cudaGetErrorString);
  return next(e);
}

const char* cudaGetErrorName(cudaError_t e) {
  if (const char* t = capture_error(e, true)) return t;
  static auto next = NEXT(cudaGetErrorName);
  return next(e);
}

// ---- hooks for tests ----

int fakegraph_is_loaded(void) { return 1; }

long fakegraph_stat(const char* name) {
  if (name == nullptr) return -1;
  if (strcmp(name, "captures_begun") == 0) return st_begun;
  if (strcmp(name, "captures_ended") == 0) return st_ended;
  if (strcmp(name, "captures_invalidated") == 0) return st_invalidated;
  if (strcmp(name, "launches") == 0) return st_launches;
  if (strcmp(name, "nodes_recorded") == 0) return st_nodes;
  std::lock_guard<std::mutex> g(mu);
  if (strcmp(name, "graphs_live") == 0) return static_cast<long>(graphs.size());
  if (strcmp(name, "execs_live") == 0) return static_cast<long>(execs.size());
  return -1;
}

}  // extern "C"
