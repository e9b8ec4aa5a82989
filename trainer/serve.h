// `treetrain serve`: a VLA policy server (issue 17) that external simulators drive. JSON lines
// over TCP; one reply line per request line; many connections and sessions at once (one poll()
// loop; a session is its own KV cache, model/policy.h, so it is the context the model was
// trained on: the instruction, then the history of the checkpoint's data.history).
//
// Requests (every one names its "session", a string):
//   {"session": S, "reset": true, "instruction": [ids]}        -> {"session": S, "ok": true}
//   {"session": S, "images": [base64 PNG | JPEG, ...], "state": [floats]}   (state optional)
//       -> {"session": S, "step": t, "tokens": [ids], "action": [floats]}     continuous actions
//          (the checkpoint's action_bins.json decodes the tokens), or
//       -> {"session": S, "step": t, "tokens": [ids], "action_ids": [ids]}   discrete (--action-ids)
//   {"session": S, "close": true}                              -> {"session": S, "ok": true}
// Images must be the tower's size (vision.image_size square) and are normalised as in training.
// A bad request (malformed JSON, a missing or mistyped field, an unknown session, an undecodable
// or wrongly sized image, a state of the wrong length, too many sessions) gets
// {"error": "...", "session": S when known} and changes nothing; a line longer than
// max_message_bytes gets an error reply and its connection is closed (the stream cannot be
// resynchronised). Nothing a client sends stops the server.
#pragma once

#include <cstdint>
#include <string>

namespace tt::trainer {

struct ServeOptions {
  std::string checkpoint;    // a run_dir (its newest checkpoint) or a checkpoint folder
  std::string host = "127.0.0.1";
  int port = 0;              // 0: any free port (printed on the first line of stdout)
  int64_t max_message_bytes = 16 << 20;
  int max_sessions = 1024;
  int window = -1;           // -1: the checkpoint's data.history
  // Discrete actions: n tokens among ids [first, end) (e.g. the nav environment's 8:12); else
  // the checkpoint's action_bins.json (dims tokens among its bins' ids).
  int action_tokens = 1;
  int32_t action_first = -1, action_end = -1;
  int64_t max_requests = -1;  // tests: stop after this many request lines (-1: run until killed)
};

// Serves until max_requests lines were answered (or forever); returns the number answered.
int64_t run_serve(const ServeOptions& opt);

}  // namespace tt::trainer
