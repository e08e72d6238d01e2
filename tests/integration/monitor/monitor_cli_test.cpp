// The monitoring options and outputs of the real binary: where the endpoint says it is, the errors
// for a bad address or token file, a taken port moved past, report.html at the end of a run and
// `trainflow report` on a run directory.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>

#include "tests/integration/cli_fixture.h"
#include "tests/test_net.h"

namespace tf {
namespace {

using cli_testing::CliFixture;
using cli_testing::ReadAll;
using cli_testing::RunResult;
namespace fs = std::filesystem;

class MonitorCli : public CliFixture {
 protected:
  void SetUp() override {
    CliFixture::SetUp();
    train_bin_ = TokenFile("train.bin", 400);
  }
  std::string train_bin_;
};

TEST_F(MonitorCli, TheRunSaysWhereItServesAndWritesTheReport) {
  const RunResult r = Train({"--train_data", train_bin_, "--max_steps", "5", "--metrics_addr", "127.0.0.1:0"});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(monitor: rank 0 at http://127\.0\.0\.1:(\d+)/)"))) << r;
  EXPECT_GT(std::stoi(m[1]), 0);
  const std::string report = ReadAll(Path("out/report.html"));
  ASSERT_FALSE(report.empty()) << "no out/report.html";
  EXPECT_NE(report.find("<svg"), std::string::npos);
  EXPECT_EQ(report.find("<script"), std::string::npos);
  // The same report on demand, elsewhere.
  const RunResult again = Run({"report", Path("out"), "--out", Path("elsewhere.html")});
  ASSERT_EQ(again.exit_code, 0) << again;
  EXPECT_NE(again.out.find(Path("elsewhere.html")), std::string::npos) << again;
  EXPECT_NE(ReadAll(Path("elsewhere.html")).find("<svg"), std::string::npos);
}

TEST_F(MonitorCli, OffServesNothing) {
  const RunResult r = Train({"--train_data", train_bin_, "--metrics_addr", "off"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out.find("monitor:"), std::string::npos) << r;
}

TEST_F(MonitorCli, BadAddressesAndTokenFilesAreNamed) {
  for (const char* bad : {"localhost", "127.0.0.1:99999", "127.0.0.1:port"}) {
    const RunResult r = Train({"--train_data", train_bin_, "--metrics_addr", bad});
    ExpectCleanFailure(r, {"metrics_addr", bad});
  }
  // Not an address of this machine (TEST-NET-1): refused at bind, not sent anywhere.
  ExpectCleanFailure(Train({"--train_data", train_bin_, "--metrics_addr", "192.0.2.1:9470"}), {"192.0.2.1"});
  ExpectCleanFailure(Train({"--train_data", train_bin_, "--metrics_token_file", Path("missing")}),
                     {"metrics_token_file", Path("missing")});
  std::ofstream(Path("empty_token")) << "\n";
  ExpectCleanFailure(Train({"--train_data", train_bin_, "--metrics_token_file", Path("empty_token")}),
                     {"metrics_token_file", "no token"});
}

TEST_F(MonitorCli, ATakenPortIsMovedPastAndLogged) {
  // Occupy a port, then ask for it.
  testing_util::Listener busy;
  const int port = busy.port;
  const RunResult r = Train({"--train_data", train_bin_, "--metrics_addr", "127.0.0.1:" + std::to_string(port)});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("port " + std::to_string(port) + " in use"), std::string::npos) << r;
  EXPECT_EQ(r.out.find("at http://127.0.0.1:" + std::to_string(port) + "/"), std::string::npos) << r;
}

// The evaluation of the initial weights is in metrics.jsonl (an "eval" event of step 0, before the
// step records) and in the report, as a validation point and an event.
TEST_F(MonitorCli, TheEvaluationBeforeTrainingIsRecorded) {
  const std::string val_bin = TokenFile("val.bin", 400);
  const RunResult r = Train({"--train_data", train_bin_, "--val_data", val_bin, "--max_steps", "4", "--eval_interval", "2",
                             "--eval_batches", "1", "--metrics_addr", "off"});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::istringstream lines(ReadAll(Path("out/metrics.jsonl")));
  std::string line;
  std::vector<nlohmann::json> records;
  while (std::getline(lines, line)) records.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(records.size(), 5u) << ReadAll(Path("out/metrics.jsonl"));
  EXPECT_EQ(records[0].value("event", ""), "eval") << records[0];
  EXPECT_EQ(records[0].value("step", -1), 0) << records[0];
  ASSERT_TRUE(records[0].contains("val_loss") && records[0]["val_loss"].is_number()) << records[0];
  EXPECT_NEAR(records[0]["val_loss"].get<double>(), std::log(256.0), 0.5) << "the untrained byte model's loss";
  for (int step = 1; step <= 4; ++step) EXPECT_EQ(records[step].value("step", -1), step) << records[step];
  EXPECT_TRUE(records[2].contains("val_loss") && records[4].contains("val_loss"));
  const std::string report = ReadAll(Path("out/report.html"));
  EXPECT_NE(report.find("before training"), std::string::npos) << "the step-0 evaluation is not among the events";
  EXPECT_NE(report.find("(step 0 to 4)"), std::string::npos) << "the curves do not start at the step-0 evaluation";
}

// report.html lists the supervisor's incidents (launch/incidents.jsonl in the run directory, where
// `trainflow launch` keeps them): restarts, failures, rescues, recoveries.
TEST_F(MonitorCli, TheReportListsTheJobsRestarts) {
  ASSERT_EQ(Train({"--train_data", train_bin_, "--max_steps", "3", "--metrics_addr", "off"}).exit_code, 0);
  fs::create_directories(Path("out/launch"));
  std::ofstream(Path("out/launch/incidents.jsonl"))
      << R"({"kind":"hung","rank":1,"host":"n1","step":2,"detail":"no progress: rank 1 on n1","generation":0,)"
      << R"("rescue":{"ok":true,"seconds":0.2},"restart":1,"time":"2026-12-07T10:00:00Z"})" << "\n"
      << R"({"kind":"recovered","generation":1,"step":3,"failure_to_step_s":4.5,"time":"2026-12-07T10:00:05Z"})" << "\n"
      << std::string(70000, '[') << "\n"
      << R"({"kind":"failed","rank":0,"detail":"exit code 1","restart":2,"time":"2026-12-07T10:01:00Z"})" << "\n";
  const RunResult r = Run({"report", Path("out")});
  ASSERT_EQ(r.exit_code, 0) << r;
  const std::string html = ReadAll(Path("out/report.html"));
  EXPECT_EQ(html.find("<th>events</th><td>none"), std::string::npos) << "the summary says there were no events";
  for (const char* needle : {"no progress: rank 1 on n1; restart 1", "training again, 4.5 s after the failure",
                             "exit code 1; restart 2", "1 unreadable lines skipped", "&quot;rescue&quot;"}) {
    EXPECT_NE(html.find(needle), std::string::npos) << needle;
  }
}

TEST_F(MonitorCli, ReportOfADirectoryWithoutMetricsIsAClearError) {
  fs::create_directories(Path("empty"));
  ExpectCleanFailure(Run({"report", Path("empty")}), {"metrics.jsonl", Path("empty")});
  std::ofstream(Path("empty/metrics.jsonl")) << "not json\n";
  ExpectCleanFailure(Run({"report", Path("empty")}), {"no step records"});
}

}  // namespace
}  // namespace tf
