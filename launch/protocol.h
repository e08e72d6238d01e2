// The messages of the heartbeat protocol between the supervisor (launch/supervisor.h) and each
// rank's agent (launch/rank_agent.h): every message type and field name, one definition for both
// sides (docs/fault-tolerance.md "Heartbeat protocol" lists who sends what). The wire format —
// greeting, authentication, framing of a JSON object per line — is launch/heartbeat.h's.
//
// Rank -> supervisor: hello (the identity, first on each connection), hb (every interval), failed,
// the rescue answers rescued / hash / committed / discarded, and exit (the goodbye).
// Supervisor -> rank: abort, stop, rescue (mode write or hash), commit, discard, exit.
#pragma once

namespace tf::launch::protocol {

// Message types (the "type" field of every message).
namespace msg {
inline constexpr char kHello[] = "hello";
inline constexpr char kHeartbeat[] = "hb";
inline constexpr char kFailed[] = "failed";
inline constexpr char kRescued[] = "rescued";
inline constexpr char kHash[] = "hash";
inline constexpr char kCommitted[] = "committed";
inline constexpr char kDiscarded[] = "discarded";
inline constexpr char kExit[] = "exit";  // both directions: the rank's goodbye, the supervisor's "leave now"
inline constexpr char kAbort[] = "abort";
inline constexpr char kStop[] = "stop";
inline constexpr char kRescue[] = "rescue";
inline constexpr char kCommit[] = "commit";
inline constexpr char kDiscard[] = "discard";
}  // namespace msg

// Field names.
namespace field {
inline constexpr char kType[] = "type";
// hello
inline constexpr char kRank[] = "rank";
inline constexpr char kGeneration[] = "generation";
inline constexpr char kHost[] = "host";
inline constexpr char kHostname[] = "hostname";
inline constexpr char kPid[] = "pid";
inline constexpr char kPpid[] = "ppid";
inline constexpr char kSlurmStep[] = "slurm_step";
// hb
inline constexpr char kStep[] = "step";
inline constexpr char kPhase[] = "phase";
inline constexpr char kProgress[] = "progress";
inline constexpr char kCheckpoint[] = "checkpoint";
inline constexpr char kStepTime[] = "step_time";
inline constexpr char kStartStep[] = "start_step";
inline constexpr char kFirstStepTime[] = "first_step_time";
inline constexpr char kCheckpointBytes[] = "checkpoint_bytes";
inline constexpr char kMetricsUrl[] = "metrics_url";
// failed, exit (rank)
inline constexpr char kExitCode[] = "exit_code";
inline constexpr char kError[] = "error";
inline constexpr char kRescuable[] = "rescuable";
// rescued, hash, committed, discarded
inline constexpr char kOk[] = "ok";
inline constexpr char kHash[] = "hash";
inline constexpr char kAlready[] = "already";
inline constexpr char kSeconds[] = "seconds";
// abort, exit (supervisor), rescue
inline constexpr char kReason[] = "reason";
inline constexpr char kCode[] = "code";
inline constexpr char kMode[] = "mode";
}  // namespace field

// Values of field::kMode in a rescue command.
inline constexpr char kModeWrite[] = "write";
inline constexpr char kModeHash[] = "hash";

}  // namespace tf::launch::protocol
