#include "parallel/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <cstring>
#include <exception>
#include <utility>

#include "core/error.h"
#include "parallel/tcp_store.h"

namespace m3 {

struct GlooRendezvous::Store {
  std::shared_ptr<gloo::rendezvous::Store> store;
};

GlooRendezvous GlooRendezvous::in_process() {
  GlooRendezvous r;
  r.store = std::make_shared<Store>(Store{std::make_shared<gloo::rendezvous::HashStore>()});
  return r;
}

namespace {

// gloo's store interface over the TCP store (which already bounds its waits and names itself in
// its errors).
class TcpGlooStore final : public gloo::rendezvous::Store {
 public:
  explicit TcpGlooStore(std::shared_ptr<TcpStore> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::vector<char>& data) override { store_->set(key, data); }
  std::vector<char> get(const std::string& key) override { return store_->get(key); }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys, store_->timeout()); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  std::shared_ptr<TcpStore> store_;
};

}  // namespace

GlooRendezvous GlooRendezvous::tcp(std::shared_ptr<TcpStore> store) {
  M3_CHECK(store != nullptr, "GlooRendezvous::tcp: no store");
  GlooRendezvous r;
  r.store = std::make_shared<Store>(Store{std::make_shared<TcpGlooStore>(std::move(store))});
  return r;
}

namespace {

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::Context> context, std::string group_name)
      : context_(std::move(context)), group_name_(std::move(group_name)) {}

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }
  std::string_view engine() const override { return "gloo"; }
  const std::string& group_name() const override { return group_name_; }

  void all_reduce(Tensor x, ReduceOp op) override {
    check_host("all_reduce", x);
    M3_CHECK(x.dtype() == DType::kF32 || x.dtype() == DType::kI32 || x.dtype() == DType::kI64,
             "gloo all_reduce in group '{}': dtype {} is not reducible (F32, I32 and I64 are)", group_name_,
             dtype_name(x.dtype()));
    if (size() == 1 || x.numel() == 0) return;
    run("all_reduce", [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setTag(next_tag());
      switch (x.dtype()) {
        case DType::kF32:
          opts.setOutput(x.data_as<float>(), x.numel());
          opts.setReduceFunction(reduce_function<float>(op));
          break;
        case DType::kI32:
          opts.setOutput(x.data_as<int32_t>(), x.numel());
          opts.setReduceFunction(reduce_function<int32_t>(op));
          break;
        case DType::kI64:
          opts.setOutput(x.data_as<int64_t>(), x.numel());
          opts.setReduceFunction(reduce_function<int64_t>(op));
          break;
        default:
          break;  // checked above
      }
      gloo::allreduce(opts);
    });
  }

  void all_gather(const Tensor& in, Tensor out) override {
    check_collective_shapes("all_gather", *this, in, out, in.numel() * size());
    check_host("all_gather", in);
    check_host("all_gather", out);
    if (size() == 1) {
      std::memcpy(out.data(), in.data(), in.nbytes());
      return;
    }
    run("all_gather", [&] {
      gloo::AllgatherOptions opts(context_);
      opts.setTag(next_tag());
      opts.setInput(static_cast<uint8_t*>(in.data()), in.nbytes());
      opts.setOutput(static_cast<uint8_t*>(out.data()), out.nbytes());
      gloo::allgather(opts);
    });
  }

  // Gloo's reduce-scatter is an old-style algorithm class on fixed buffers; an all-reduce of a
  // scratch copy and keeping this rank's part gives the same sums (the CPU path is for
  // correctness, not speed).
  void reduce_scatter(const Tensor& in, Tensor out) override {
    M3_CHECK(in.numel() % size() == 0, "reduce_scatter in group '{}': {} elements do not split over {} ranks",
             group_name_, in.numel(), size());
    check_collective_shapes("reduce_scatter", *this, in, out, in.numel() / size());
    check_host("reduce_scatter", in);
    check_host("reduce_scatter", out);
    Tensor scratch = Tensor::zeros(in.shape(), in.dtype());
    std::memcpy(scratch.data(), in.data(), in.nbytes());
    all_reduce(scratch, ReduceOp::kSum);
    std::memcpy(out.data(), static_cast<const uint8_t*>(scratch.data()) + out.nbytes() * rank(), out.nbytes());
  }

  void all_to_all(const Tensor& in, const std::vector<int64_t>& send_rows, Tensor out,
                  const std::vector<int64_t>& recv_rows) override {
    check_all_to_all_rows(*this, in, send_rows, out, recv_rows);
    check_host("all_to_all", in);
    check_host("all_to_all", out);
    int64_t row_bytes = int64_t(dtype_size(in.dtype()));
    for (int d = 1; d < in.ndim(); ++d) row_bytes *= in.dim(d);
    std::vector<int64_t> send_bytes, recv_bytes;
    for (int64_t r : send_rows) send_bytes.push_back(r * row_bytes);
    for (int64_t r : recv_rows) recv_bytes.push_back(r * row_bytes);
    run("all_to_all", [&] {
      gloo::AlltoallvOptions opts(context_);
      opts.setTag(next_tag());
      opts.setInput(static_cast<uint8_t*>(in.data()), send_bytes);
      opts.setOutput(static_cast<uint8_t*>(out.data()), recv_bytes);
      gloo::alltoallv(opts);
    });
  }

  void broadcast(Tensor x, int root) override {
    M3_CHECK(root >= 0 && root < size(), "broadcast in group '{}': root {} outside [0, {})", group_name_, root,
             size());
    check_host("broadcast", x);
    if (size() == 1 || x.nbytes() == 0) return;
    run("broadcast", [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setTag(next_tag());
      opts.setRoot(root);
      opts.setOutput(static_cast<uint8_t*>(x.data()), x.nbytes());
      gloo::broadcast(opts);
    });
  }

  void barrier() override {
    if (size() == 1) return;
    run("barrier", [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(next_tag());
      gloo::barrier(opts);
    });
  }

 private:
  template <class T>
  static gloo::AllreduceOptions::Func reduce_function(ReduceOp op) {
    if (op == ReduceOp::kMax) return [](void* c, const void* a, const void* b, size_t n) { gloo::max<T>(c, a, b, n); };
    return [](void* c, const void* a, const void* b, size_t n) { gloo::sum<T>(c, a, b, n); };
  }

  void check_host(const char* what, const Tensor& t) const {
    M3_CHECK(t.device() == Device::kCpu, "gloo {} in group '{}': the tensor is on {}, gloo moves host memory", what,
             group_name_, device_name(t.device()));
  }

  // Every rank issues the same collectives in the same order, so a per-communicator counter
  // gives matching tags without any exchange.
  uint32_t next_tag() { return tag_++; }

  template <class F>
  void run(const char* what, F&& body) {
    try {
      body();
    } catch (const gloo::Exception& e) {
      fail("gloo {} failed in group '{}' (rank {} of {}): {}", what, group_name_, rank(), size(), e.what());
    }
  }

  std::shared_ptr<gloo::Context> context_;
  std::string group_name_;
  uint32_t tag_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> connect_gloo(GlooRendezvous& rendezvous, int rank, int size, std::string group_name,
                                           const GlooOptions& options) {
  M3_CHECK(size >= 1 && rank >= 0 && rank < size, "gloo group '{}': rank {} of {} is not a rank", group_name, rank,
           size);
  M3_CHECK(rendezvous.store && rendezvous.store->store, "gloo group '{}': no rendezvous store", group_name);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(options.timeout);
    gloo::rendezvous::PrefixStore store(group_name, *rendezvous.store->store);
    context->connectFullMesh(store, device);
    return std::make_unique<GlooCommunicator>(std::move(context), std::move(group_name));
  } catch (const gloo::Exception& e) {
    fail("gloo group '{}': rank {} of {} could not connect on {}: {}", group_name, rank, size, options.hostname,
         e.what());
  } catch (const Error& e) {  // the TCP store's: a peer that never came, node 0's store gone
    fail("gloo group '{}': rank {} of {} could not meet its peers: {}", group_name, rank, size, e.what());
  }
}

}  // namespace m3
