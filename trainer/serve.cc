// The VLA policy server (see serve.h): one poll() loop over the listening socket and the clients.
#include "trainer/serve.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "base/base64.h"
#include "base/check.h"
#include "base/files.h"
#include "data/actions.h"
#include "data/frames.h"
#include "data/image.h"
#include "model/decoder.h"
#include "model/hf_io.h"
#include "model/policy.h"
#include "trainer/sample.h"

namespace tt::trainer {
namespace {

namespace fs = std::filesystem;
using Exec = model::CpuExec<float>;
using json = nlohmann::json;

struct Conn {
  int fd = -1;
  std::string in;  // bytes not yet forming a line
};

class Server {
 public:
  explicit Server(const ServeOptions& opt) : opt_(opt) {
    dir_ = resolve_checkpoint(opt.checkpoint);
    cfg_ = model::read_hf_config(dir_);
    if (!cfg_.vision.enabled())
      throw Error(str(dir_, "/config.json: a text model (no vision_config); serve needs a VLA checkpoint"));
    window_ = opt.window >= 0 ? opt.window : checkpoint_history_window(dir_);
    const fs::path bins = fs::path(dir_) / "action_bins.json";
    if (opt.action_first >= 0) {
      tokens_ = opt.action_tokens;
      first_ = opt.action_first;
      end_ = opt.action_end;
      TT_CHECK(tokens_ >= 1 && first_ < end_ && end_ <= cfg_.vocab_size, "--action-ids ", first_, ":", end_,
               " and --action-tokens ", tokens_, ": expected ids inside the vocabulary of ", cfg_.vocab_size);
    } else if (fs::exists(bins)) {
      bins_ = data::ActionBins::from_json(read_text(bins.string(), "the action bins"), bins.string());
      continuous_ = true;
      tokens_ = bins_.dims();
      first_ = bins_.first_id();
      end_ = (int32_t)bins_.vocab_size;
    } else {
      throw Error(str(dir_, ": no action_bins.json (continuous actions); for discrete actions pass --action-ids "
                            "FIRST:END and --action-tokens N"));
    }
    model_ = load_inference_model<Exec>(cfg_, dir_);
  }

  int64_t run() {
    const int lfd = listen_on(opt_.host, opt_.port);
    sockaddr_in a{};
    socklen_t len = sizeof a;
    getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
    std::cout << "listening on " << opt_.host << ":" << ntohs(a.sin_port) << std::endl;
    spdlog::info("serve: {} ({} history, {} action token(s) among ids {}..{}{}) on {}:{}", dir_,
                 window_ == 0 ? std::string("full") : str("window ", window_), tokens_, first_, end_ - 1,
                 continuous_ ? ", continuous via action_bins.json" : "", opt_.host, ntohs(a.sin_port));
    std::vector<Conn> conns;
    int64_t answered = 0;
    while (opt_.max_requests < 0 || answered < opt_.max_requests) {
      std::vector<pollfd> fds = {{lfd, POLLIN, 0}};
      for (const Conn& c : conns) fds.push_back({c.fd, POLLIN, 0});
      if (poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        throw Error(str("serve: poll: ", std::strerror(errno)));
      }
      std::vector<Conn> keep;
      for (size_t i = 0; i + 1 < fds.size(); ++i) {  // the connections polled (fds[i + 1])
        Conn c = conns[i];
        bool open = true;
        const bool limit = opt_.max_requests >= 0 && answered >= opt_.max_requests;
        if (!limit && (fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) {
          char buf[1 << 16];
          const ssize_t n = recv(c.fd, buf, sizeof buf, 0);
          if (n <= 0) {
            open = false;
          } else {
            c.in.append(buf, (size_t)n);
            size_t nl;
            while (open && (nl = c.in.find('\n')) != std::string::npos) {
              const std::string line = c.in.substr(0, nl);
              c.in.erase(0, nl + 1);
              if (line.empty()) continue;
              send_line(c.fd, handle(line));
              ++answered;
              if (opt_.max_requests >= 0 && answered >= opt_.max_requests) break;
            }
            if ((int64_t)c.in.size() > opt_.max_message_bytes) {
              send_line(c.fd, json{{"error", str("message longer than ", opt_.max_message_bytes,
                                                 " bytes without a newline; closing the connection")}}
                                  .dump());
              ++answered;
              open = false;
            }
          }
        }
        if (open) {
          keep.push_back(c);
        } else {
          close(c.fd);
        }
      }
      if (fds[0].revents & POLLIN) {  // a new connection joins the next poll
        const int fd = accept(lfd, nullptr, nullptr);
        if (fd >= 0) keep.push_back(Conn{fd, ""});
      }
      conns = std::move(keep);
    }
    for (const Conn& c : conns) close(c.fd);
    close(lfd);
    return answered;
  }

 private:
  static int listen_on(const std::string& host, int port) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    TT_CHECK(fd >= 0, "serve: socket: ", std::strerror(errno));
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) throw Error(str("--host ", host, ": not an IPv4 address"));
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd, 64) != 0)
      throw Error(str("serve: cannot listen on ", host, ":", port, ": ", std::strerror(errno)));
    return fd;
  }

  static void send_line(int fd, const std::string& text) {
    const std::string line = text + "\n";
    size_t off = 0;
    while (off < line.size()) {
      const ssize_t n = send(fd, line.data() + off, line.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;  // the client went away: its problem, not the server's
      off += (size_t)n;
    }
  }

  // One request line -> one reply (never throws).
  std::string handle(const std::string& line) {
    std::string session;
    try {
      json j;
      try {
        j = json::parse(line);
      } catch (const json::exception& e) {
        throw Error(str("malformed JSON: ", e.what()));
      }
      if (!j.is_object() || !j.contains("session") || !j.at("session").is_string())
        throw Error("expected a JSON object with a \"session\" string");
      session = j.at("session").get<std::string>();
      if (j.value("reset", false)) {
        if (!j.contains("instruction") || !j.at("instruction").is_array() || j.at("instruction").empty())
          throw Error("reset needs \"instruction\": a non-empty list of token ids");
        std::vector<int32_t> ins;
        for (const json& t : j.at("instruction")) {
          if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= cfg_.vocab_size)
            throw Error(str("instruction holds ", t.dump(), ", expected token ids in [0, ", cfg_.vocab_size, ")"));
          ins.push_back(t.get<int32_t>());
        }
        auto it = sessions_.find(session);
        if (it == sessions_.end()) {
          if ((int)sessions_.size() >= opt_.max_sessions)
            throw Error(str("too many sessions (", opt_.max_sessions, "); close one first"));
          const int64_t cap = std::min<int64_t>(cfg_.max_position_embeddings, 1 << 14) + tokens_;
          it = sessions_.emplace(session, std::make_unique<Session>(*model_, window_, cap)).first;
        }
        it->second->policy.reset(ins);
        it->second->steps = 0;
        return json{{"session", session}, {"ok", true}}.dump();
      }
      auto it = sessions_.find(session);
      if (it == sessions_.end()) throw Error(str("unknown session \"", session, "\" (reset it first)"));
      if (j.value("close", false)) {
        sessions_.erase(it);
        return json{{"session", session}, {"ok", true}}.dump();
      }
      if (!j.contains("images") || !j.at("images").is_array() || j.at("images").empty())
        throw Error("expected \"images\": a non-empty list of base64 PNG or JPEG images (or reset / close)");
      model::Observation obs;
      const int S = (int)cfg_.vision.image_size;
      for (size_t k = 0; k < j.at("images").size(); ++k) {
        const json& im = j.at("images")[k];
        const std::string what = str("images[", k, "]");
        if (!im.is_string()) throw Error(str(what, ": expected a base64 string"));
        const data::Image img = data::decode_image_bytes(base64_decode(im.get<std::string>(), what), what);
        if (img.width != S || img.height != S)
          throw Error(str(what, ": ", img.width, " x ", img.height, " pixels, expected ", S, " x ", S,
                          " (the tower's vision.image_size)"));
        const data::FrameSpec fs;  // the tower's normalisation, as training frames get it
        obs.frames.push_back(data::tower_pixels(img, S, fs.mean, fs.std));
      }
      if (j.contains("state")) {
        if (!j.at("state").is_array()) throw Error("\"state\" must be a list of numbers");
        for (const json& v : j.at("state")) {
          if (!v.is_number() || !std::isfinite(v.get<double>())) throw Error("\"state\" must hold finite numbers");
          obs.state.push_back(v.get<float>());
        }
      }
      if ((int64_t)obs.state.size() != cfg_.vision.state_dim)
        throw Error(str("\"state\" has ", obs.state.size(), " values, expected vision.state_dim = ",
                        cfg_.vision.state_dim));
      Session& s = *it->second;
      const std::vector<int32_t> tokens = s.policy.act(obs, tokens_, first_, end_);
      json out = {{"session", session}, {"step", s.steps++}, {"tokens", tokens}};
      if (continuous_) {
        out["action"] = bins_.decode(tokens);
      } else {
        out["action_ids"] = tokens;
      }
      return out.dump();
    } catch (const std::exception& e) {
      json err = {{"error", e.what()}};
      if (!session.empty()) err["session"] = session;
      return err.dump();
    }
  }

  struct Session {
    model::VlaPolicy<Exec> policy;
    int64_t steps = 0;
    Session(model::Decoder<Exec>& m, int window, int64_t capacity) : policy(m, window, capacity) {}
  };

  ServeOptions opt_;
  std::string dir_;
  model::ModelConfig cfg_;
  int window_ = 0;
  bool continuous_ = false;
  data::ActionBins bins_;
  int tokens_ = 1;
  int32_t first_ = 0, end_ = 0;
  std::unique_ptr<model::Decoder<Exec>> model_;
  std::map<std::string, std::unique_ptr<Session>> sessions_;
};

}  // namespace

int64_t run_serve(const ServeOptions& opt) {
  Server s(opt);
  return s.run();
}

}  // namespace tt::trainer
