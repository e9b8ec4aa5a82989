// `treetrain serve`: a VLA policy server (issue 17) that external simulators drive. JSON lines
// over TCP; one reply line per request line; many connections and sessions at once (one poll()
// loop; a session is its own KV cache, model/policy.h, so it is the context the model was
// trained on: the instruction, then the history of the checkpoint's data.history).
//
// Requests (every one names its "session", a non-empty string; one a line, ending in "\n" or
// "\r\n"; empty lines are skipped; a last line without its newline is answered once the client
// shuts down its sending side):
//   {"session": S, "reset": true, "instruction": [ids]}        -> {"session": S, "ok": true}
//   {"session": S, "images": [base64 PNG | JPEG, ...], "state": [floats]}   (state optional)
//       -> {"session": S, "step": t, "tokens": [ids], "action": [floats]}     continuous actions
//          (the checkpoint's action_bins.json decodes the tokens), or
//       -> {"session": S, "step": t, "tokens": [ids], "action_ids": [ids]}   discrete (--action-ids)
//   {"session": S, "close": true}                              -> {"session": S, "ok": true}
// Exactly one of "reset": true, "images" or "close": true per request, and no other keys than
// these, "instruction" (reset) and "state" (images). Session names are 1 to 256 bytes; log lines
// quote them JSON-escaped (a name may hold newlines and control characters).
// Images must be the tower's size (vision.image_size square; checked from the header, before the
// pixels are decoded) and are normalised as in training; state values must be finite as 32-bit
// floats. A session's context (its KV cache) holds min(max_position_embeddings, 16384) rows: an
// instruction must leave room for one step (a frame's rows, the state row and the action
// tokens), and with the full history the context grows every step until a step no longer fits
// (an error: reset the session).
// A bad request (malformed JSON or invalid UTF-8, a missing, unknown or mistyped field, an
// unknown session, an undecodable or wrongly sized image, a state of the wrong length or out of
// float range, an instruction too long for the context, too many sessions) gets
// {"error": "...", "session": S when known} and changes nothing: a failed reset leaves the
// session as it was (or creates none), a failed step leaves its history as it was. A line longer
// than max_message_bytes gets an error reply and its connection is closed (the stream cannot be
// resynchronised). The request bytes buffered across all connections are at most
// max_buffered_bytes: reads take only what fits, and while a connection waits to read with none
// left, the one holding the longest unfinished line gets an error reply naming the limit and is
// closed (the others are served on). Replies a client does not read wait in a
// buffer of its own (sockets are non-blocking); past max_message_bytes unsent, that client is
// disconnected with a log line, so a client that pipelines requests and never reads cannot stall
// the others. A connection's pipelined lines are answered at most 16 a turn (the rest wait in its
// buffer, unread bytes in its socket), so one client's burst does not hold up the others' replies.
// A connection the server closes ends its side of the stream after the last reply and drops
// what the client still sends until the client closes (at most 2 s), so that reply is not lost to
// a reset. Nothing a client sends stops the server.
// Sessions are global, not tied to a connection: a session lives until it is closed (by any
// connection), it has gone unused for session_idle_s (its KV cache is freed, a log line says so,
// and a request naming it gets "session S was closed after N s unused (--session-idle-s ...);
// reset it"), or the server stops. A connection that closes leaves its sessions open, so a client
// reconnects to them. max_sessions bounds the open ones.
// A reset runs in pieces of reset_piece_rows instruction tokens, one a turn of the loop, so other
// clients are answered while a long instruction (with segments it has no bound) goes in; the
// connection's later lines wait for its reply, and the session takes its name (replacing an open
// one, whose steps go on meanwhile) only once the last piece is in; its idle time counts from
// then. A reset of a name another connection is resetting is refused (the earlier would overwrite
// it). A connection that fails meanwhile (reset by the client, or closed by the server) drops its
// reset with a log line; one that only stopped sending gets its reply. The sessions' contexts
// together hold at most max_cache_bytes: a reset is refused when its fresh context (less the one
// it replaces) would pass it, and stopped with an error when its context grows past it (a
// retrieval pool grows with the instruction); a step is refused while they are past it (with
// retrieval a step may grow the pool, so they may pass it by one step's growth). The errors name
// the bytes held and the limit. Until a replacing reset is through both contexts are held: one
// context at most past the limit for each reset under way.
#pragma once

#include <cstdint>
#include <string>

namespace tt::trainer {

struct ServeOptions {
  std::string checkpoint;    // a run_dir (its newest checkpoint) or a checkpoint folder
  std::string host = "127.0.0.1";
  int port = 0;              // 0: any free port (printed on the first line of stdout)
  int64_t max_message_bytes = 16 << 20;
  // Request bytes buffered across all connections (-1: 16 x max_message_bytes, 256 MB at the
  // default; else at least max_message_bytes + 2).
  int64_t max_buffered_bytes = -1;
  int max_sessions = 1024;   // sessions, and connections, at once
  double session_idle_s = 3600;  // a session unused this long is closed (0: never; at most 1e9)
  int window = -1;           // -1: the checkpoint's data.history
  // Discrete actions: n tokens among ids [first, end) (e.g. the nav environment's 8:12); else
  // the checkpoint's action_bins.json (dims tokens among its bins' ids; action_tokens then 0 or
  // the bins' dims, anything else an error). 0: not given (1 for discrete actions). The
  // action tokens and one step's rows must fit the context (the startup checks it).
  int action_tokens = 0;
  int32_t action_first = -1, action_end = -1;
  // A reset's instruction goes into its session's context this many rows a turn of the loop, the
  // other clients' requests answered between pieces (a long instruction does not stall them).
  int64_t reset_piece_rows = 256;
  // Bytes the sessions' contexts (KV caches, recurrent states, retrieval pools) may hold together
  // (-1: three quarters of the memory available at startup, MemAvailable or the cgroup's limit).
  int64_t max_cache_bytes = -1;
  // Tests: stop after this many request lines, once the resets under way are answered (-1: run
  // until killed).
  int64_t max_requests = -1;
};

// Serves until max_requests lines were answered (or forever); returns the number answered.
int64_t run_serve(const ServeOptions& opt);

}  // namespace tt::trainer
