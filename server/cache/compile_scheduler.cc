#include "server/cache/compile_scheduler.h"

#include <algorithm>
#include <cmath>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace kiln::cache {
namespace {

bool IsDeterministicFailure(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kAborted:
      return false;
    default:
      return true;
  }
}

}  // namespace

absl::string_view CompileRoleName(CompileRole role) {
  switch (role) {
    case CompileRole::kCompiled:
      return "compiled";
    case CompileRole::kJoined:
      return "joined";
    case CompileRole::kNegativeHit:
      return "negative_hit";
    case CompileRole::kRejected:
      return "rejected";
  }
  return "unknown";
}

CompileScheduler::CompileScheduler(CompileSchedulerOptions options) : options_(options) {
  const int workers = std::max(1, options_.workers);
  stats_.workers = workers;
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

CompileScheduler::~CompileScheduler() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (const std::shared_ptr<Flight>& flight : queue_) {
      flight->status = absl::UnavailableError("kilnd is shutting down; the compile did not start");
      flight->done = true;
      flights_.erase(flight->key);
    }
    queue_.clear();
    stats_.queued = 0;
  }
  for (std::thread& t : workers_) t.join();
  // Callers still inside Run (waiting on a compile that has now finished, or on their deadline)
  // must be out before the mutex they hold is destroyed.
  absl::MutexLock lock(&mu_);
  auto no_callers = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return callers_ == 0; };
  mu_.Await(absl::Condition(&no_callers));
}

absl::Duration CompileScheduler::EstimateWaitLocked() const {
  const double rounds =
      std::ceil(static_cast<double>(queue_.size() + 1) / static_cast<double>(stats_.workers));
  return std::max(absl::Seconds(1), absl::Seconds(std::ceil(
                                        rounds * absl::ToDoubleSeconds(mean_compile_))));
}

CompileReply CompileScheduler::Run(absl::string_view key, CompileFn compile, absl::Time deadline) {
  const absl::Time start = absl::Now();
  CompileReply reply;
  absl::MutexLock lock(&mu_);
  ++callers_;
  auto leave = absl::MakeCleanup([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { --callers_; });
  if (auto neg = negative_.find(key); neg != negative_.end()) {
    if (start < neg->second.expires) {
      ++stats_.negative_hits;
      reply.status = neg->second.status;
      reply.role = CompileRole::kNegativeHit;
      return reply;
    }
    negative_.erase(neg);
    stats_.negative_entries = static_cast<int64_t>(negative_.size());
  }
  if (deadline <= start) {
    ++stats_.deadline_exceeded;
    reply.status = absl::DeadlineExceededError("deadline passed before the compile could start");
    return reply;
  }
  if (stopping_) {
    reply.status = absl::UnavailableError("kilnd is shutting down");
    return reply;
  }
  std::shared_ptr<Flight> flight;
  if (auto found = flights_.find(key); found != flights_.end()) {
    flight = found->second;
    reply.role = CompileRole::kJoined;
    ++stats_.joined;
  } else {
    if (static_cast<int64_t>(queue_.size()) >= options_.max_queued) {
      ++stats_.rejected;
      reply.retry_after = EstimateWaitLocked();
      reply.status = absl::ResourceExhaustedError(absl::StrCat(
          "compile queue is full (", queue_.size(), " compiles waiting, ", stats_.in_flight,
          " running on ", stats_.workers, " workers); retry in about ",
          absl::FormatDuration(reply.retry_after)));
      return reply;
    }
    flight = std::make_shared<Flight>();
    flight->key = std::string(key);
    flight->compile = std::move(compile);
    flights_.emplace(flight->key, flight);
    queue_.push_back(flight);
    stats_.queued = static_cast<int64_t>(queue_.size());
    ++stats_.compiles;
    reply.role = CompileRole::kCompiled;
  }
  const bool done = mu_.AwaitWithDeadline(absl::Condition(&flight->done), deadline);
  reply.waited = absl::Now() - start;
  if (!done) {
    ++stats_.deadline_exceeded;
    reply.status = absl::DeadlineExceededError(
        absl::StrCat("gave up after ", absl::FormatDuration(reply.waited),
                     " waiting for the compile of ", key,
                     "; it continues and its result will be cached"));
    return reply;
  }
  reply.status = flight->status;
  reply.bytes = flight->bytes;
  return reply;
}

void CompileScheduler::RememberFailureLocked(const std::string& key, const absl::Status& status) {
  if (options_.negative_ttl <= absl::ZeroDuration() || !IsDeterministicFailure(status)) return;
  const absl::Time now = absl::Now();
  if (negative_.size() >= options_.max_negative_entries) {
    absl::erase_if(negative_, [now](const auto& kv) { return kv.second.expires <= now; });
    while (negative_.size() >= options_.max_negative_entries) negative_.erase(negative_.begin());
  }
  negative_[key] = Failure{status, now + options_.negative_ttl};
  stats_.negative_entries = static_cast<int64_t>(negative_.size());
}

void CompileScheduler::WorkerLoop() {
  while (true) {
    std::shared_ptr<Flight> flight;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping
      flight = std::move(queue_.front());
      queue_.pop_front();
      stats_.queued = static_cast<int64_t>(queue_.size());
      ++stats_.in_flight;
    }
    const absl::Time start = absl::Now();
    absl::StatusOr<std::string> result = flight->compile();
    const absl::Duration took = absl::Now() - start;
    flight->compile = nullptr;  // release what the closure holds before waking anyone
    absl::MutexLock lock(&mu_);
    --stats_.in_flight;
    mean_compile_ = mean_compile_ * 0.8 + took * 0.2;
    if (result.ok()) {
      flight->bytes = std::make_shared<const std::string>(*std::move(result));
    } else {
      ++stats_.failures;
      flight->status = result.status();
      spdlog::info("compile of {} failed after {}: {}", flight->key, absl::FormatDuration(took),
                   flight->status.ToString());
      RememberFailureLocked(flight->key, flight->status);
    }
    flights_.erase(flight->key);
    flight->done = true;
  }
}

CompileSchedulerStats CompileScheduler::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace kiln::cache
