// Elastic data-parallel training on braid: four ranks train an MLP with
// braid's DDP layer; one is killed with SIGKILL mid-training; the other
// three shrink the communicator without it and go on; a replacement
// process joins them (grow), receives the parameters and the optimizer's
// state by broadcast, and all four go on.
//
//   build/bin/elastic_train [--ranks 4] [--steps 1500] [--kill-rank 2]
//                           [--kill-at 2.0] [--join-after 1.5] [--out DIR]
//
// The program is its own launcher: it starts the ranks (this program again,
// with --worker), kills one at --kill-at seconds, starts the replacement
// --join-after seconds later, and once they are done draws the loss with
// the moments of the kill, the shrink and the join into DIR/loss.svg (the
// numbers are in DIR/loss.csv and DIR/events.csv). Rank 0 prints the loss.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../ddp_mlp/mlp.h"
#include "braid/braid.h"
#include "braid/ddp.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  int ranks = 4;
  int steps = 1500;
  int killRank = 2;
  double killAt = 2.0, joinAfter = 1.5;
  std::string out;
  // A worker's (set by the launcher):
  int worker = -1;    // this process's rank; -1: the launcher
  bool join = false;  // a replacement
  int64_t start = 0;  // the launcher's start, steady-clock ns (the same clock in every process)
};

double secondsSince(int64_t start) {
  const int64_t now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  return (now - start) / 1e9;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Writes `text` to `path` whole: a reader never sees half of it.
void writeFile(const std::string& path, const std::string& text) {
  const std::string partial = path + ".partial";
  std::ofstream(partial) << text;
  std::rename(partial.c_str(), path.c_str());
}

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

template <typename... Values>
std::string format(const char* pattern, Values... values) {
  char text[512];
  std::snprintf(text, sizeof(text), pattern, values...);
  return text;
}

std::string waitForFile(const std::string& path) {
  while (!exists(path)) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  return readFile(path);
}

// ---------------------------------------------------------------- a worker

// The model, its Adam state and the DDP layer, on the current communicator.
class Trainer {
 public:
  Trainer() : model_({64, 128, 128, 16}, 1234u) {
    for (mlp::Linear& layer : model_.layers)
      for (std::vector<float>* values : {&layer.weight, &layer.bias}) {
        m_.emplace_back(values->size(), 0.0f);
        v_.emplace_back(values->size(), 0.0f);
      }
  }

  // Binds the DDP layer to `comm` and takes rank 0's parameters, Adam
  // state and step: the state every rank goes on from after the
  // communicator changed (a survivor may have applied one update more
  // than another when a rank died in the middle of a step).
  void adopt(braid::Communicator& comm) {
    sync_.reset();
    std::vector<braid::ddp::Parameter> params;
    for (size_t l = 0; l < model_.layers.size(); ++l) {
      mlp::Linear& layer = model_.layers[l];
      params.push_back({"fc" + std::to_string(l) + ".weight", layer.weightGrad.data(),
                        layer.weightGrad.size(), braid::DataType::Float32, layer.weight.data()});
      params.push_back({"fc" + std::to_string(l) + ".bias", layer.biasGrad.data(),
                        layer.biasGrad.size(), braid::DataType::Float32, layer.bias.data()});
    }
    sync_ = std::make_unique<braid::ddp::GradSync>(comm, params);
    sync_->broadcastParameters(0);
    for (size_t k = 0; k < m_.size(); ++k) {
      comm.broadcast(m_[k].data(), m_[k].data(), m_[k].size(), braid::DataType::Float32, 0);
      comm.broadcast(v_[k].data(), v_[k].data(), v_[k].size(), braid::DataType::Float32, 0);
    }
    comm.broadcast(&step_, &step_, 1, braid::DataType::Int32, 0);
  }

  int step() const { return step_; }

  // One step of data-parallel training; returns the loss averaged over ranks.
  float train(braid::Communicator& comm) {
    const int rank = comm.rank(), ranks = comm.size();
    constexpr int kBatch = 32;  // samples per rank
    std::vector<float> x(kBatch * model_.inputs()), y(kBatch * model_.outputs());
    for (int s = 0; s < kBatch; ++s)
      mlp::sample((static_cast<uint64_t>(step_) * ranks + rank) * kBatch + s, model_.inputs(),
                  model_.outputs(), &x[s * model_.inputs()], &y[s * model_.outputs()]);
    model_.zeroGrad();
    const float loss = model_.step(x.data(), y.data(), kBatch, 1.0f, [&](size_t l) {
      sync_->markReady(2 * l);
      sync_->markReady(2 * l + 1);
    });
    sync_->finish();
    ++step_;
    size_t k = 0;
    for (mlp::Linear& layer : model_.layers)
      for (auto [values, grads] :
           {std::pair{&layer.weight, &layer.weightGrad}, std::pair{&layer.bias, &layer.biasGrad}}) {
        adam(*values, *grads, m_[k], v_[k]);
        ++k;
      }
    float mean = 0.0f;
    comm.allReduce(&loss, &mean, 1, braid::DataType::Float32, braid::ReduceOp::Avg);
    return mean;
  }

 private:
  void adam(std::vector<float>& w, const std::vector<float>& g, std::vector<float>& m,
            std::vector<float>& v) const {
    const float beta1 = 0.9f, beta2 = 0.999f, lr = 0.002f;
    const float c1 = 1.0f - std::pow(beta1, static_cast<float>(step_));
    const float c2 = 1.0f - std::pow(beta2, static_cast<float>(step_));
    for (size_t i = 0; i < w.size(); ++i) {
      m[i] = beta1 * m[i] + (1.0f - beta1) * g[i];
      v[i] = beta2 * v[i] + (1.0f - beta2) * g[i] * g[i];
      w[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + 1e-8f);
    }
  }

  mlp::Model model_;
  std::vector<std::vector<float>> m_, v_;
  int32_t step_ = 0;
  std::unique_ptr<braid::ddp::GradSync> sync_;
};

int runWorker(const Args& args) {
  const std::string& dir = args.out;
  auto event = [&](const std::string& what) {
    const double t = secondsSince(args.start);
    std::printf("t=%6.3fs  %s\n", t, what.c_str());
    std::fflush(stdout);
    std::ofstream(dir + "/events.csv", std::ios::app) << t << "," << what << "\n";
  };
  braid::Communicator comm;
  if (args.join) {
    writeFile(dir + "/join-request", std::to_string(::getpid()));
    std::istringstream grow(waitForFile(dir + "/grow-id"));
    int nranks = 0;
    std::string hex;
    grow >> nranks >> hex;
    comm = braid::Communicator::init(nranks, nranks - 1, braid::UniqueId::fromHex(hex));
  } else {
    const braid::UniqueId id = braid::UniqueId::fromHex(waitForFile(dir + "/id"));
    comm = braid::Communicator::init(args.ranks, args.worker, id);
  }
  Trainer trainer;
  trainer.adopt(comm);
  if (args.join)
    event(format("the replacement joined as rank %d: %d ranks", comm.rank(), comm.size()));
  std::ofstream losses;
  while (trainer.step() < args.steps) {
    try {
      // Rank 0 looks for a replacement waiting to join; every rank learns.
      int32_t joining = comm.rank() == 0 && exists(dir + "/join-request") ? 1 : 0;
      comm.allReduce(&joining, &joining, 1, braid::DataType::Int32, braid::ReduceOp::Max);
      if (joining) {
        braid::UniqueId id;
        if (comm.rank() == 0) {
          id = comm.growId();
          std::remove((dir + "/join-request").c_str());
          writeFile(dir + "/grow-id", std::to_string(comm.size() + 1) + " " + id.toHex());
        }
        comm = comm.grow(comm.size() + 1, comm.rank() == 0 ? &id : nullptr);
        trainer.adopt(comm);
        if (comm.rank() == 0) event(format("grew to %d ranks: training goes on", comm.size()));
        continue;  // the replacement starts its steps with the look above, as all do
      }
      const float loss = trainer.train(comm);
      if (comm.rank() == 0) {
        if (!losses.is_open()) losses.open(dir + "/loss.csv", std::ios::app);
        losses << secondsSince(args.start) << "," << trainer.step() << "," << comm.size() << ","
               << loss << "\n";
        if (trainer.step() % 100 == 0) {
          std::printf("t=%6.3fs  step %4d  %d ranks  loss %.5f\n", secondsSince(args.start),
                      trainer.step(), comm.size(), loss);
          std::fflush(stdout);
        }
      }
    } catch (const braid::Error& error) {
      if (args.worker == 0 || comm.rank() == 0)
        event(format("step %d failed: %s", trainer.step() + 1, error.what()));
      comm = comm.shrink();  // the survivors agree on who is gone
      trainer.adopt(comm);
      if (comm.rank() == 0) {
        std::string after;
        if (exists(dir + "/killed"))
          after = format(", %.3f s after the kill",
                         secondsSince(std::stoll(readFile(dir + "/killed"))));
        event(format("shrunk to %d ranks%s: training goes on", comm.size(), after.c_str()));
      }
    }
  }
  if (comm.rank() == 0) event(format("done: %d steps", trainer.step()));
  return 0;
}

// ---------------------------------------------------------------- the launcher

// DIR/loss.svg: the loss against time (a log scale), the number of ranks
// as a band under it, and a line at each event.
void drawPlot(const std::string& dir) {
  struct Point {
    double t, loss;
    int ranks;
  };
  std::vector<Point> points;
  std::istringstream csv(readFile(dir + "/loss.csv"));
  std::string line;
  while (std::getline(csv, line)) {
    Point p{};
    int step = 0;
    if (std::sscanf(line.c_str(), "%lf,%d,%d,%lf", &p.t, &step, &p.ranks, &p.loss) == 4 &&
        p.loss > 0)
      points.push_back(p);
  }
  if (points.empty()) return;
  std::vector<std::pair<double, std::string>> events;
  std::istringstream eventsCsv(readFile(dir + "/events.csv"));
  while (std::getline(eventsCsv, line))
    if (const size_t comma = line.find(','); comma != std::string::npos)
      events.emplace_back(std::atof(line.c_str()), line.substr(comma + 1, 44));
  const double w = 900, h = 440, left = 70, right = 20, top = 20, bottom = 80;
  double tMax = 0, low = points[0].loss, high = points[0].loss;
  for (const Point& p : points) {
    tMax = std::max(tMax, p.t);
    low = std::min(low, p.loss);
    high = std::max(high, p.loss);
  }
  const double decadeLow = std::floor(std::log10(low)), decadeHigh = std::ceil(std::log10(high));
  auto x = [&](double t) { return left + t / tMax * (w - left - right); };
  auto y = [&](double loss) {
    return top + (decadeHigh - std::log10(loss)) / (decadeHigh - decadeLow) * (h - top - bottom);
  };
  std::ofstream svg(dir + "/loss.svg");
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << w << "' height='" << h
      << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' "
         "fill='white'/>\n";
  for (double d = decadeLow; d <= decadeHigh; ++d)  // the loss axis, one line per decade
    svg << "<line x1='" << left << "' x2='" << w - right << "' y1='" << y(std::pow(10, d))
        << "' y2='" << y(std::pow(10, d)) << "' stroke='#eee'/><text x='8' y='"
        << y(std::pow(10, d)) + 4 << "'>1e" << d << "</text>\n";
  for (int s = 0; s <= static_cast<int>(tMax); ++s)
    svg << "<text x='" << x(s) - 3 << "' y='" << h - bottom + 16 << "'>" << s << "</text>\n";
  svg << "<text x='" << left << "' y='" << h - 8
      << "'>seconds; the loss (log scale, averaged over the ranks) and, below, the ranks "
         "training</text>\n";
  for (size_t i = 0; i < points.size();) {  // the ranks: a band per stretch of one size
    size_t j = i;
    while (j + 1 < points.size() && points[j + 1].ranks == points[i].ranks) ++j;
    const double from = x(i ? points[i - 1].t : 0), to = x(points[j].t);
    svg << "<rect x='" << from << "' y='" << h - bottom + 24 << "' width='" << to - from
        << "' height='20' fill='" << (points[i].ranks % 2 ? "#cde" : "#dec") << "'/><text x='"
        << from + 4 << "' y='" << h - bottom + 38 << "'>" << points[i].ranks << " ranks</text>\n";
    i = j + 1;
  }
  svg << "<polyline fill='none' stroke='#1f5fbf' stroke-width='1' points='";
  for (const Point& p : points) svg << x(p.t) << "," << y(p.loss) << " ";
  svg << "'/>\n";
  for (size_t i = 0; i < events.size(); ++i) {
    const double at = x(std::min(events[i].first, tMax));
    svg << "<line x1='" << at << "' x2='" << at << "' y1='" << top << "' y2='" << h - bottom + 44
        << "' stroke='#c33' stroke-dasharray='4 3'/>\n<text x='" << at + 3 << "' y='"
        << top + 14 * (i % 5 + 1) << "' fill='#c33'>" << events[i].second << "</text>\n";
  }
  svg << "</svg>\n";
}

pid_t startWorker(const Args& args, int rank, bool join) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  std::vector<std::string> words = {"elastic_train",
                                    "--worker",
                                    std::to_string(rank),
                                    "--out",
                                    args.out,
                                    "--start",
                                    std::to_string(args.start),
                                    "--steps",
                                    std::to_string(args.steps),
                                    "--ranks",
                                    std::to_string(args.ranks)};
  if (join) words.push_back("--join");
  std::vector<char*> argv;
  for (std::string& word : words) argv.push_back(word.data());
  argv.push_back(nullptr);
  ::execv("/proc/self/exe", argv.data());
  std::perror("execv");
  std::_Exit(127);
}

int runLauncher(Args args) {
  if (args.out.empty()) {
    char pattern[] = "/tmp/braid-elastic-XXXXXX";
    if (!::mkdtemp(pattern)) return std::perror("mkdtemp"), 1;
    args.out = pattern;
  } else if (::mkdir(args.out.c_str(), 0755) != 0 && errno != EEXIST) {
    std::perror(args.out.c_str());
    return 1;
  }
  for (const char* stale :
       {"/id", "/killed", "/events.csv", "/loss.csv", "/grow-id", "/join-request"})
    std::remove((args.out + stale).c_str());
  args.start =
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  std::printf(
      "elastic_train: %d ranks, rank %d killed at %.1f s, a replacement %.1f s later; "
      "files in %s\n",
      args.ranks, args.killRank, args.killAt, args.joinAfter, args.out.c_str());
  std::fflush(stdout);
  std::vector<pid_t> workers;
  for (int r = 0; r < args.ranks; ++r) workers.push_back(startWorker(args, r, false));
  writeFile(args.out + "/id", braid::Communicator::newUniqueId().toHex());
  std::this_thread::sleep_for(std::chrono::duration<double>(args.killAt));
  ::kill(workers[args.killRank], SIGKILL);
  const int64_t killedAt =
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  writeFile(args.out + "/killed", std::to_string(killedAt));
  std::printf("t=%6.3fs  rank %d killed (kill -9)\n", secondsSince(args.start), args.killRank);
  std::ofstream(args.out + "/events.csv", std::ios::app)
      << secondsSince(args.start) << ",rank " << args.killRank << " killed\n";
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::duration<double>(args.joinAfter));
  std::printf("t=%6.3fs  a replacement starts\n", secondsSince(args.start));
  std::fflush(stdout);
  workers.push_back(startWorker(args, args.ranks, true));
  int failed = 0;
  for (size_t i = 0; i < workers.size(); ++i) {
    int status = 0;
    ::waitpid(workers[i], &status, 0);
    if (static_cast<int>(i) != args.killRank && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
      ++failed;
  }
  drawPlot(args.out);
  std::printf("elastic_train: %s; the plot is %s/loss.svg\n",
              failed ? "a worker failed" : "every worker finished", args.out.c_str());
  return failed ? 1 : 0;
}

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--join") {
      args.join = true;
      continue;
    }
    if (flag == "-h" || flag == "--help" || i + 1 >= argc) {
      std::printf(
          "usage: elastic_train [--ranks N] [--steps N] [--kill-rank R] [--kill-at S] "
          "[--join-after S] [--out DIR]\n");
      std::exit(flag == "-h" || flag == "--help" ? 0 : 2);
    }
    const std::string value = argv[++i];
    if (flag == "--ranks")
      args.ranks = std::atoi(value.c_str());
    else if (flag == "--steps")
      args.steps = std::atoi(value.c_str());
    else if (flag == "--kill-rank")
      args.killRank = std::atoi(value.c_str());
    else if (flag == "--kill-at")
      args.killAt = std::atof(value.c_str());
    else if (flag == "--join-after")
      args.joinAfter = std::atof(value.c_str());
    else if (flag == "--out")
      args.out = value;
    else if (flag == "--worker")
      args.worker = std::atoi(value.c_str());
    else if (flag == "--start")
      args.start = std::stoll(value);
    else {
      std::fprintf(stderr, "elastic_train: unknown option %s\n", flag.c_str());
      std::exit(2);
    }
  }
  if (args.ranks < 2 || args.steps < 1 || args.killRank < 1 || args.killRank >= args.ranks) {
    std::fprintf(stderr,
                 "elastic_train: --ranks is at least 2 and --kill-rank in [1, ranks) "
                 "(rank 0 prints and draws)\n");
    std::exit(2);
  }
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  try {
    return args.worker < 0 ? runLauncher(args) : runWorker(args);
  } catch (const braid::Error& error) {
    std::fprintf(stderr, "elastic_train: %s\n", error.what());
    return 1;
  }
}
