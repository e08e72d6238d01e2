// checkpoint/s3_store.h against real servers: s3rver (a local S3-compatible server, installed by
// scripts/install_s3rver.sh) on loopback, reached through tests/integration/checkpoint/s3_fault_proxy.py, which
// injects faults (errors, slow, stalled and dropped answers, a request held while the server is
// killed), shrinks list pages and captures requests; boto3/botocore (tests/integration/checkpoint/s3_interop.py)
// is the independent client and the SigV4 reference. Without s3rver the server tests fail, naming
// the install script; TRAINFLOW_SKIP_S3_TESTS=1 skips them. Every server is killed by PID at the
// end of its suite or test (and by the kernel if this process dies first: PR_SET_PDEATHSIG).
#include "base/sha256.h"
#include "checkpoint/s3_store.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/integration/checkpoint/s3_test_servers.h"
#include "tests/test_dir.h"

namespace tf::checkpoint {
namespace {

namespace fs = std::filesystem;
using namespace s3_testing;  // NOLINT: the servers, Child and helpers of s3_test_servers.h

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr char kSecret[] = "S3RVER";  // any secret does: s3rver does not check SigV4 signatures

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(s.data() + i, &v, std::min<size_t>(8, n - i));
  }
  return s;
}

// ---- The building blocks, without a server --------------------------------------------------

TEST(S3InternalTest, UriEncodingAndXmlTexts) {
  using namespace s3_internal;
  EXPECT_EQ(UriEncode("az-AZ_09.~ /+=&%"), "az-AZ_09.~%20%2F%2B%3D%26%25");
  EXPECT_EQ(UriDecode("a%20b%2Fc%2bd+e%zz%4"), "a b/c+d+e%zz%4");
  EXPECT_EQ(UriDecode("a+b%2B", /*plus_is_space=*/true), "a b+");
  const std::string xml =
      "<?xml version=\"1.0\"?><R xmlns=\"x\"><KeyCount>2</KeyCount><Contents><Key>a&amp;b &lt;c&gt; &quot;d&quot; "
      "&apos;e&apos; &#233;&#x20AC;</Key></Contents><Contents><Key><![CDATA[x<y]]></Key></Contents><Key/>"
      "<Key attr=\"1\">z</Key><Keys>no</Keys></R>";
  EXPECT_EQ(XmlElementTexts(xml, "Key"),
            (std::vector<std::string>{"a&b <c> \"d\" 'e' \xC3\xA9\xE2\x82\xAC", "x<y", "", "z"}));
  EXPECT_EQ(XmlElementTexts(xml, "KeyCount"), std::vector<std::string>{"2"});
  EXPECT_TRUE(XmlElementTexts(xml, "Missing").empty());
  EXPECT_TRUE(XmlElementTexts("<Key>unterminated", "Key").empty());
}

TEST(S3InternalTest, ParsesUrls) {
  auto u = s3_internal::ParseS3Url("s3://my-bucket.v2/runs/a/");
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(u->bucket, "my-bucket.v2");
  EXPECT_EQ(u->prefix, "runs/a/");
  EXPECT_EQ(s3_internal::ParseS3Url("s3://bkt")->prefix, "");
  EXPECT_EQ(s3_internal::ParseS3Url("s3://bkt/")->prefix, "");
  EXPECT_TRUE(IsS3Url("s3://x"));
  EXPECT_FALSE(IsS3Url("/mnt/s3://x"));
  for (const char* bad : {"s3:/bkt", "http://bkt/x", "s3://", "s3://ab", "s3://Upper", "s3://bkt/a//b", "s3://bkt/../x",
                          "s3://-bkt", "s3://bkt?x=1", "s3://bkt/sp ace", "s3://b..kt"}) {
    auto r = s3_internal::ParseS3Url(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find(std::string("'") + bad + "'"), std::string::npos) << r.status().ToString();
  }
}

TEST(S3InternalTest, BuildsPathAndVirtualHostUrls) {
  using s3_internal::RequestUrl;
  using A = S3Options::Addressing;
  S3Options aws;
  aws.region = "eu-west-1";
  EXPECT_EQ(RequestUrl(aws, "bkt", "p/k.bin", ""), "https://bkt.s3.eu-west-1.amazonaws.com/p/k.bin");
  EXPECT_EQ(RequestUrl(aws, "bkt", "", "list-type=2&prefix=p%2F"),
            "https://bkt.s3.eu-west-1.amazonaws.com/?list-type=2&prefix=p%2F");
  // A dotted bucket is no valid TLS host name under *.s3.amazonaws.com: path-style.
  EXPECT_EQ(RequestUrl(aws, "my.bkt", "k", "uploads="), "https://s3.eu-west-1.amazonaws.com/my.bkt/k?uploads=");
  aws.addressing = A::kPath;
  EXPECT_EQ(RequestUrl(aws, "bkt", "k", ""), "https://s3.eu-west-1.amazonaws.com/bkt/k");
  S3Options custom;
  custom.region = "us-east-1";
  custom.endpoint = "http://127.0.0.1:4568";
  EXPECT_EQ(RequestUrl(custom, "bkt", "p/k", "partNumber=1&uploadId=u"),
            "http://127.0.0.1:4568/bkt/p/k?partNumber=1&uploadId=u");
  EXPECT_EQ(RequestUrl(custom, "bkt", "", "list-type=2"), "http://127.0.0.1:4568/bkt?list-type=2");
  custom.endpoint = "https://minio.example:9000";
  custom.addressing = A::kVirtualHost;
  EXPECT_EQ(RequestUrl(custom, "bkt", "k", ""), "https://bkt.minio.example:9000/k");
}

TEST(S3OptionsTest, FromEnvironmentFilesAndPrecedence) {
  testing_util::TestDir tmp("tf_s3_env");
  ScopedAwsEnv env;
  env.Set("HOME", tmp.path());
  {  // nothing anywhere: defaults, unsigned requests
    auto o = S3OptionsFromEnvironment();
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    EXPECT_EQ(o->region, "us-east-1");
    EXPECT_EQ(o->endpoint, "");
    EXPECT_EQ(o->access_key, "");
    EXPECT_EQ(o->addressing, S3Options::Addressing::kAuto);
  }
  fs::create_directories(tmp.path() + "/.aws");
  std::ofstream(tmp.path() + "/.aws/credentials")
      << "# comment\n[default]\naws_access_key_id = DEFKEY\naws_secret_access_key = defsecret\n\n"
         "[work]\naws_access_key_id=WORKKEY\naws_secret_access_key=worksecret\naws_session_token = worktoken\n";
  std::ofstream(tmp.path() + "/.aws/config")
      << "[default]\nregion = eu-central-1\n[profile work]\nregion = ap-south-1\nendpoint_url = http://work:9000/\n"
         "s3 =\n  addressing_style = virtual\n  endpoint_url = http://work-s3:9000\n"
         "[profile cfgonly]\naws_access_key_id = CFGKEY\naws_secret_access_key = cfgsecret\n";
  {
    auto o = S3OptionsFromEnvironment();
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    EXPECT_EQ(o->access_key, "DEFKEY");
    EXPECT_EQ(o->secret_key, "defsecret");
    EXPECT_EQ(o->region, "eu-central-1");
  }
  env.Set("AWS_PROFILE", "work");
  {
    auto o = S3OptionsFromEnvironment();
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    EXPECT_EQ(o->access_key, "WORKKEY");
    EXPECT_EQ(o->session_token, "worktoken");
    EXPECT_EQ(o->region, "ap-south-1");
    EXPECT_EQ(o->endpoint, "http://work-s3:9000");  // the s3 sub-setting wins over the profile's
    EXPECT_EQ(o->addressing, S3Options::Addressing::kVirtualHost);
  }
  env.Set("AWS_PROFILE", "cfgonly");
  EXPECT_EQ(S3OptionsFromEnvironment()->access_key, "CFGKEY");
  env.Set("AWS_PROFILE", "work");
  // Variables win over files; a key from the environment brings its own secret and token.
  env.Set("AWS_ACCESS_KEY_ID", "ENVKEY");
  env.Set("AWS_SECRET_ACCESS_KEY", "envsecret");
  env.Set("AWS_DEFAULT_REGION", "us-west-1");
  env.Set("AWS_ENDPOINT_URL", "http://generic:1");
  {
    auto o = S3OptionsFromEnvironment();
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    EXPECT_EQ(o->access_key, "ENVKEY");
    EXPECT_EQ(o->secret_key, "envsecret");
    EXPECT_EQ(o->session_token, "");
    EXPECT_EQ(o->region, "us-west-1");
    EXPECT_EQ(o->endpoint, "http://generic:1");
  }
  env.Set("AWS_REGION", "us-west-2");
  env.Set("AWS_ENDPOINT_URL_S3", "http://s3only:2/");
  EXPECT_EQ(S3OptionsFromEnvironment()->region, "us-west-2");
  EXPECT_EQ(S3OptionsFromEnvironment()->endpoint, "http://s3only:2");
  // Files named by variables; a profile that is nowhere is an error naming it.
  std::ofstream(tmp.path() + "/creds") << "[other]\naws_access_key_id = OTHER\naws_secret_access_key = s\n";
  env.Set("AWS_SHARED_CREDENTIALS_FILE", tmp.path() + "/creds");
  env.Set("AWS_CONFIG_FILE", tmp.path() + "/none");
  env.Set("AWS_PROFILE", "missing");
  auto missing = S3OptionsFromEnvironment();
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("'missing'"), std::string::npos) << missing.status().ToString();
  ::unsetenv("AWS_ACCESS_KEY_ID");
  env.Set("AWS_PROFILE", "other");
  EXPECT_EQ(S3OptionsFromEnvironment()->access_key, "OTHER");
}

TEST(S3OptionsTest, OpenRefusesBadUrlsAndOptionsBeforeAnyRequest) {
  S3Options o;
  o.endpoint = "http://127.0.0.1:9";  // nothing is asked of it
  auto bad_url = OpenS3Store("s3://UPPER/x", o);
  ASSERT_FALSE(bad_url.ok());
  EXPECT_EQ(bad_url.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_url.status().message().find("s3://UPPER/x"), std::string::npos);
  auto expect_invalid = [](const S3Options& opt, const std::string& word) {
    auto r = OpenS3Store("s3://bucket/p", opt);
    ASSERT_FALSE(r.ok()) << word;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
    EXPECT_NE(r.status().message().find(word), std::string::npos) << r.status().ToString();
  };
  S3Options x = o;
  x.part_bytes = 1 << 20;
  expect_invalid(x, "part_bytes");
  x = o;
  x.parallelism = 0;
  expect_invalid(x, "parallelism");
  x = o;
  x.max_attempts = 0;
  expect_invalid(x, "max_attempts");
  x = o;
  x.request_timeout_s = 0;
  expect_invalid(x, "timeouts");
  x = o;
  x.endpoint = "ftp://host";
  expect_invalid(x, "ftp://host");
  x = o;
  x.access_key = "AKIDONLY";
  expect_invalid(x, "secret key");
  x = o;
  x.region = "EU_West";
  expect_invalid(x, "region");
}

// ---- Against s3rver ---------------------------------------------------------------------------

// The suite's s3rver and proxy, started by the first test that needs them.
struct Servers {
  testing_util::TestDir dir{"tf_s3rver"};
  S3rver s3rver;
  FaultProxy proxy;
};

class S3StoreTest : public ::testing::Test {
 protected:
  static void TearDownTestSuite() { servers_.reset(); }

  void SetUp() override {
    if (SkipServerTests()) GTEST_SKIP() << "TRAINFLOW_SKIP_S3_TESTS=1";
    UnsetHttpProxies();
    ASSERT_TRUE(S3rverInstalled());
    if (!servers_) {
      auto s = std::make_unique<Servers>();
      const int s3_port = FreePort(), proxy_port = FreePort();
      ASSERT_TRUE(s->s3rver.Start(s->dir.path() + "/data", s3_port, s->dir.path() + "/s3rver.log"));
      ASSERT_TRUE(s->proxy.Start(proxy_port, s3_port, s->dir.path() + "/proxy.log"));
      servers_ = std::move(s);
    }
    proxy().Arm("mode=pass");
    prefix_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  FaultProxy& proxy() { return servers_->proxy; }
  std::string Url() const { return std::string("s3://") + kBucket + "/" + prefix_; }
  std::string Display(const std::string& key) const { return Url() + "/" + key; }

  // Fast retries and small parts, for tests.
  S3Options Options() {
    S3Options o;
    o.endpoint = proxy().endpoint();
    o.region = "us-east-1";
    o.access_key = "S3RVER";
    o.secret_key = kSecret;
    o.part_bytes = 5 * kMiB;
    o.parallelism = 3;
    o.max_attempts = 4;
    o.base_backoff_s = 0.01;
    o.max_backoff_s = 0.05;
    o.connect_timeout_s = 2;
    o.request_timeout_s = 10;
    return o;
  }
  std::unique_ptr<ObjectStore> Open(const S3Options& o) {
    auto s = OpenS3Store(Url(), o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }

  static std::unique_ptr<Servers> servers_;
  std::string prefix_;
};
std::unique_ptr<Servers> S3StoreTest::servers_;

TEST_F(S3StoreTest, PutGetListDeleteRoundTrip) {
  auto store = Open(Options());
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->location(), Url());
  const std::string one = RandomBytes(1000, 1);
  ASSERT_TRUE(store->Put("a/one.bin", one).ok());
  ASSERT_TRUE(store->Put("a/empty.bin", "").ok());
  ASSERT_TRUE(store->Put("b/two.bin", "2").ok());
  EXPECT_EQ(*store->Get("a/one.bin"), one);
  EXPECT_EQ(*store->Get("a/empty.bin"), "");
  ASSERT_TRUE(store->Put("a/one.bin", "uno").ok());  // replaced whole
  EXPECT_EQ(*store->Get("a/one.bin"), "uno");
  EXPECT_EQ(*store->List(""), (std::vector<std::string>{"a/empty.bin", "a/one.bin", "b/two.bin"}));
  EXPECT_EQ(*store->List("a/"), (std::vector<std::string>{"a/empty.bin", "a/one.bin"}));
  EXPECT_EQ(*store->List("a/o"), std::vector<std::string>{"a/one.bin"});
  EXPECT_EQ(*store->List("a/one.bin"), std::vector<std::string>{"a/one.bin"});
  EXPECT_TRUE(store->List("zzz")->empty());

  auto missing = store->Get("a/none.bin");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(Display("a/none.bin") + ": GET failed: 404 NoSuchKey"), std::string::npos)
      << missing.status().ToString();

  ASSERT_TRUE(store->Delete("a/one.bin").ok());
  EXPECT_EQ(store->Get("a/one.bin").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(store->Delete("a/one.bin").ok());  // idempotent
  EXPECT_TRUE(store->Delete("never/was.bin").ok());
  EXPECT_EQ(*store->List(""), (std::vector<std::string>{"a/empty.bin", "b/two.bin"}));

  // Bad keys are refused before any request.
  proxy().Arm("mode=pass");
  for (const char* bad : {"", "/abs", "a//b", "../up", "sp ace", "x.tmp.1"}) {
    EXPECT_EQ(store->Put(bad, "x").code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(store->Get(bad).status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(store->Delete(bad).code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(proxy().Requests(), 0);
}

TEST_F(S3StoreTest, MultipartPutAndParallelRangedGetAreByteExact) {
  auto store = Open(Options());
  ASSERT_NE(store, nullptr);
  const std::string big = RandomBytes(10 * kMiB + 12345, 2);  // parts of 5, 5 and ~0.01 MiB
  proxy().Arm("mode=pass");
  ASSERT_TRUE(store->Put("big.bin", big).ok());
  EXPECT_EQ(proxy().Kind("create_multipart"), 1);
  EXPECT_EQ(proxy().Kind("upload_part"), 3);
  EXPECT_EQ(proxy().Kind("complete_multipart"), 1);
  EXPECT_EQ(proxy().Kind("put"), 0);
  proxy().Arm("mode=pass");
  auto got = store->Get("big.bin");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->size(), big.size());
  EXPECT_TRUE(*got == big);
  EXPECT_EQ(proxy().Kind("get"), 3);  // one range per part

  // Exactly one part: a single PUT and a single GET.
  const std::string edge = RandomBytes(5 * kMiB, 3);
  proxy().Arm("mode=pass");
  ASSERT_TRUE(store->Put("edge.bin", edge).ok());
  EXPECT_TRUE(*store->Get("edge.bin") == edge);
  EXPECT_EQ(proxy().Kind("put"), 1);
  EXPECT_EQ(proxy().Kind("upload_part"), 0);
  EXPECT_EQ(proxy().Kind("get"), 1);
}

TEST_F(S3StoreTest, ListFollowsContinuationTokens) {
  auto store = Open(Options());
  ASSERT_NE(store, nullptr);
  std::vector<std::string> expected;
  for (int i = 0; i < 23; ++i) {
    const std::string key = fmt::format("many/{}k-{:03d}", i % 5 == 0 ? "sub/" : "", i);
    ASSERT_TRUE(store->Put(key, std::to_string(i)).ok());
    expected.push_back(key);
  }
  ASSERT_TRUE(store->Put("other/x", "x").ok());
  std::sort(expected.begin(), expected.end());
  proxy().Arm("mode=pass&max_keys=4");  // pages of 4 keys
  auto listed = store->List("many/");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(*listed, expected);
  EXPECT_GE(proxy().Kind("list"), 6);
  auto some = store->List("many/k-01");
  ASSERT_TRUE(some.ok()) << some.status().ToString();
  EXPECT_EQ(some->size(), 8u);  // k-011 .. k-019 but not k-015 (under sub/)
}

TEST_F(S3StoreTest, ListAnswersAreBoundedNotHeldWhole) {
  // A LIST answer was read into memory whole, however large (1 GB took 2.3 GB of RSS).
  S3Options o = Options();
  o.max_list_keys = 10;
  auto store = Open(o);
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(store->Put(fmt::format("k-{:02d}", i), "x").ok());
  proxy().Arm("mode=capture");
  auto listed = store->List("k-0");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(listed->size(), 10u);
  const nlohmann::json captured = proxy().Control("captured");
  ASSERT_EQ(captured.size(), 1u);
  EXPECT_NE(captured[0].at("path").get<std::string>().find("max-keys=1000"), std::string::npos) << captured.dump();
  // One answer larger than a page can be: refused while it arrives, not retried.
  proxy().Arm("mode=bloat&count=5&bytes=" + std::to_string(12 * kMiB));
  listed = store->List("k-0");
  ASSERT_FALSE(listed.ok());
  EXPECT_EQ(listed.status().code(), StatusCode::kOutOfRange) << listed.status().ToString();
  EXPECT_NE(listed.status().message().find("larger than the 8388608 bytes allowed"), std::string::npos)
      << listed.status().ToString();
  EXPECT_EQ(proxy().Kind("list"), 1);
  // More keys in all than max_list_keys, over pages of 4.
  proxy().Arm("mode=pass&max_keys=4");
  listed = store->List("k-");
  ASSERT_FALSE(listed.ok());
  EXPECT_EQ(listed.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(listed.status().message().find("holds more than 10 keys"), std::string::npos) << listed.status().ToString();
  EXPECT_LE(proxy().Kind("list"), 3);
  // More bytes of key names in all than max_list_bytes (the keys are 4 bytes each: 3 fit in 12).
  S3Options few_bytes = Options();
  few_bytes.max_list_bytes = 12;
  auto small = Open(few_bytes);
  ASSERT_NE(small, nullptr);
  proxy().Arm("mode=pass&max_keys=2");
  listed = small->List("k-");
  ASSERT_FALSE(listed.ok());
  EXPECT_EQ(listed.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(listed.status().message().find("more than 12 bytes of key names"), std::string::npos)
      << listed.status().ToString();
}

TEST_F(S3StoreTest, MissingBucketWrongCredentialsAndDeadEndpointFailClearly) {
  auto start = Clock::now();
  auto no_bucket = OpenS3Store("s3://no-such-bucket-tf/run", Options());
  ASSERT_FALSE(no_bucket.ok());
  EXPECT_EQ(no_bucket.status().code(), StatusCode::kNotFound);
  for (const std::string& part : {std::string("s3://no-such-bucket-tf/run"), std::string("'no-such-bucket-tf'"),
                                  std::string("404 NoSuchBucket"), proxy().endpoint()}) {
    EXPECT_NE(no_bucket.status().message().find(part), std::string::npos) << no_bucket.status().ToString();
  }

  S3Options wrong = Options();
  wrong.access_key = "NOT-A-KEY";
  wrong.secret_key = "very-secret-do-not-print";
  wrong.session_token = "secret-session-token";
  proxy().Arm("mode=pass");
  auto denied = OpenS3Store(Url(), wrong);
  ASSERT_FALSE(denied.ok());
  EXPECT_EQ(denied.status().code(), StatusCode::kIOError);
  EXPECT_NE(denied.status().message().find("403 InvalidAccessKeyId"), std::string::npos) << denied.status().ToString();
  EXPECT_NE(denied.status().message().find(Url()), std::string::npos) << denied.status().ToString();
  EXPECT_EQ(denied.status().message().find("very-secret"), std::string::npos) << denied.status().ToString();
  EXPECT_EQ(denied.status().message().find("secret-session"), std::string::npos) << denied.status().ToString();
  EXPECT_EQ(proxy().Requests(), 1);  // a 403 is not retried

  S3Options dead = Options();
  dead.endpoint = fmt::format("http://127.0.0.1:{}", FreePort());
  dead.max_attempts = 3;
  start = Clock::now();
  auto unreachable = OpenS3Store(Url(), dead);
  ASSERT_FALSE(unreachable.ok());
  EXPECT_EQ(unreachable.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(unreachable.status().message().find(dead.endpoint + ", 3 attempts"), std::string::npos)
      << unreachable.status().ToString();
  EXPECT_LT(Since(start), 5.0);
}

TEST_F(S3StoreTest, VirtualHostAddressingReachesTheSameBucket) {
  // s3rver takes <bucket>.s3.localhost as a virtual host; curl resolves *.localhost to loopback.
  S3Options vhost = Options();
  vhost.endpoint = fmt::format("http://s3.localhost:{}", proxy().port());
  vhost.addressing = S3Options::Addressing::kVirtualHost;
  auto store = Open(vhost);
  auto path_style = Open(Options());
  ASSERT_NE(store, nullptr);
  ASSERT_NE(path_style, nullptr);
  proxy().Arm("mode=capture");
  ASSERT_TRUE(store->Put("v/x.bin", "virtual").ok());
  EXPECT_EQ(*path_style->Get("v/x.bin"), "virtual");
  EXPECT_EQ(*store->List("v/"), std::vector<std::string>{"v/x.bin"});
  const nlohmann::json captured = proxy().Control("captured");
  ASSERT_GE(captured.size(), 3u);
  const nlohmann::json& put = captured[0];
  EXPECT_EQ(put["method"], "PUT");
  EXPECT_EQ(put["path"], "/" + prefix_ + "/v/x.bin");
  bool host_seen = false;
  for (const auto& h : put["headers"]) {
    if (h[0].get<std::string>() == "Host") {
      host_seen = true;
      EXPECT_EQ(h[1], fmt::format("{}.s3.localhost:{}", kBucket, proxy().port()));
    }
  }
  EXPECT_TRUE(host_seen);
  EXPECT_EQ(captured[1]["path"], std::string("/") + kBucket + "/" + prefix_ + "/v/x.bin");
}

TEST_F(S3StoreTest, Boto3ReadsOurObjectsAndWeReadBoto3s) {
  auto store = Open(Options());
  ASSERT_NE(store, nullptr);
  testing_util::TestDir tmp("tf_s3_interop");
  const std::string small = RandomBytes(1000, 4), big = RandomBytes(5 * kMiB + 7, 5);
  ASSERT_TRUE(store->Put("ours/small.bin", small).ok());
  ASSERT_TRUE(store->Put("ours/big.bin", big).ok());  // multipart

  const std::string python = FindOnPath("python3");
  const std::string script = Source("tests/integration/checkpoint/s3_interop.py");
  const std::vector<std::string> env = {"AWS_ACCESS_KEY_ID=S3RVER", std::string("AWS_SECRET_ACCESS_KEY=") + kSecret};
  const std::string endpoint = fmt::format("http://127.0.0.1:{}", servers_->s3rver.port());
  std::string out;
  ASSERT_EQ(RunCommand({python, script, "dump", "--endpoint", endpoint, "--bucket", kBucket, "--prefix", prefix_ + "/ours/",
                 "--out-dir", tmp.path()},
                env, tmp.path() + "/dump.log", &out),
            0)
      << out;
  EXPECT_EQ(out, fmt::format("0\t{0}/ours/big.bin\n1\t{0}/ours/small.bin\n", prefix_));
  EXPECT_TRUE(ReadFile(tmp.path() + "/0") == big);
  EXPECT_EQ(ReadFile(tmp.path() + "/1"), small);

  // boto3 uploads a multipart object and one whose name needs escaping in XML; we read them.
  const std::string multi = RandomBytes(6 * kMiB + 3, 6);
  std::ofstream(tmp.path() + "/multi.bin", std::ios::binary) << multi;
  std::ofstream(tmp.path() + "/odd.bin", std::ios::binary) << "odd";
  const std::string odd = "boto/odd &<>'\"name.bin";
  ASSERT_EQ(RunCommand({python, script, "put", "--endpoint", endpoint, "--bucket", kBucket, "--key",
                 prefix_ + "/boto/multi.bin", "--in", tmp.path() + "/multi.bin", "--key", prefix_ + "/" + odd, "--in",
                 tmp.path() + "/odd.bin"},
                env, tmp.path() + "/put.log", &out),
            0)
      << out;
  EXPECT_EQ(*store->List("boto/"), (std::vector<std::string>{"boto/multi.bin", odd}));
  proxy().Arm("mode=pass");
  auto got = store->Get("boto/multi.bin");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(*got == multi);
  EXPECT_EQ(proxy().Kind("get"), 2);
}

TEST_F(S3StoreTest, SignaturesMatchBotocoreSigV4) {
  S3Options o = Options();
  o.session_token = "token/with+odd=chars";
  proxy().Arm("mode=capture&max_keys=1");  // one-key pages: continuation tokens hold '+', '/', '='
  auto store = Open(o);
  ASSERT_NE(store, nullptr);
  const std::string big = RandomBytes(5 * kMiB + 1, 7);
  ASSERT_TRUE(store->Put("sig/small.bin", "signed payload").ok());
  ASSERT_TRUE(store->Put("sig/big.bin", big).ok());
  EXPECT_EQ(*store->Get("sig/small.bin"), "signed payload");
  EXPECT_TRUE(*store->Get("sig/big.bin") == big);
  EXPECT_EQ(store->List("sig/")->size(), 2u);
  ASSERT_TRUE(store->Delete("sig/small.bin").ok());
  EXPECT_EQ(store->Get("sig/small.bin").status().code(), StatusCode::kNotFound);

  const nlohmann::json captured = proxy().Control("captured");
  // probe, 2 puts (1 + 4), 2 + 2 gets, 3 list pages, delete, get
  ASSERT_GE(captured.size(), 14u) << captured.dump();
  bool continuation = false;
  for (const auto& r : captured) continuation |= r["path"].get<std::string>().find("continuation-token=") != std::string::npos;
  EXPECT_TRUE(continuation);
  testing_util::TestDir tmp("tf_s3_sigv4");
  std::ofstream(tmp.path() + "/requests.json") << captured.dump();
  std::string out;
  const int rc = RunCommand({FindOnPath("python3"), Source("tests/integration/checkpoint/s3_interop.py"), "verify-sigv4", "--requests",
                      tmp.path() + "/requests.json"},
                     {"AWS_ACCESS_KEY_ID=S3RVER", std::string("AWS_SECRET_ACCESS_KEY=") + kSecret,
                      "AWS_SESSION_TOKEN=" + o.session_token},
                     tmp.path() + "/verify.log", &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, fmt::format("verified {} requests\n", captured.size()));

  // The check is not vacuous: a request signed for another second, and a PUT whose body is not what
  // its x-amz-content-sha256 says, are caught.
  nlohmann::json tampered = nlohmann::json::array();
  for (const auto& r : captured) {
    if (r["method"] == "PUT" && tampered.empty()) {
      nlohmann::json t = r;
      t["body_sha256"] = Sha256Hex("other bytes");
      tampered.push_back(t);
      t = r;
      for (auto& h : t["headers"]) {
        std::string name = h[0];
        std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
        if (name == "x-amz-date") {
          std::string date = h[1];
          date[date.size() - 2] = date[date.size() - 2] == '1' ? '2' : '1';  // another second
          h[1] = date;
        }
      }
      tampered.push_back(t);
    }
  }
  ASSERT_EQ(tampered.size(), 2u);
  std::ofstream(tmp.path() + "/tampered.json") << tampered.dump();
  const int bad = RunCommand({FindOnPath("python3"), Source("tests/integration/checkpoint/s3_interop.py"), "verify-sigv4",
                              "--requests", tmp.path() + "/tampered.json"},
                             {"AWS_ACCESS_KEY_ID=S3RVER", std::string("AWS_SECRET_ACCESS_KEY=") + kSecret,
                              "AWS_SESSION_TOKEN=" + o.session_token},
                             tmp.path() + "/tampered.log", &out);
  EXPECT_EQ(bad, 1) << out;
  EXPECT_NE(out.find("request 0 (PUT"), std::string::npos) << out;
  EXPECT_NE(out.find("but the body (14 bytes) hashes to"), std::string::npos) << out;
  EXPECT_NE(out.find("request 1 (PUT"), std::string::npos) << out;
  EXPECT_NE(out.find("botocore computes"), std::string::npos) << out;
}

TEST_F(S3StoreTest, RetriesThrottlingAndServerErrorsThenSucceeds) {
  auto store = Open(Options());
  ASSERT_NE(store, nullptr);
  const std::string data = RandomBytes(4000, 8);
  for (const std::string fault :
       {"status=503&code=SlowDown", "status=500&code=InternalError", "status=429&code=SlowDown",
        "status=400&code=RequestTimeout"}) {
    proxy().Arm("mode=error&count=2&" + fault);
    ASSERT_TRUE(store->Put("r/x.bin", data).ok()) << fault;
    EXPECT_EQ(proxy().Requests(), 3) << fault;
    proxy().Arm("mode=error&count=2&method=GET&" + fault);
    auto got = store->Get("r/x.bin");
    ASSERT_TRUE(got.ok()) << fault << ": " << got.status().ToString();
    EXPECT_EQ(*got, data);
    EXPECT_EQ(proxy().Kind("head"), 1) << fault;
    EXPECT_EQ(proxy().Kind("get"), 3) << fault;
  }

  // Out of attempts: Unavailable naming the key, the code and the attempts; nothing written.
  proxy().Arm("mode=error&count=100&status=503&code=SlowDown");
  const auto start = Clock::now();
  Status s = store->Put("r/never.bin", data);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find(Display("r/never.bin") + ": PUT failed: 503 SlowDown: injected by s3_fault_proxy"),
            std::string::npos)
      << s.ToString();
  EXPECT_NE(s.message().find("4 attempts"), std::string::npos) << s.ToString();
  EXPECT_EQ(proxy().Requests(), 4);
  EXPECT_LT(Since(start), 2.0);

  // Refusals are not retried.
  proxy().Arm("mode=error&count=100&status=403&code=AccessDenied");
  s = store->Put("r/denied.bin", data);
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_NE(s.message().find(Display("r/denied.bin") + ": PUT failed: 403 AccessDenied"), std::string::npos)
      << s.ToString();
  EXPECT_EQ(proxy().Requests(), 1);
  proxy().Arm("mode=pass");
  EXPECT_EQ(store->Get("r/never.bin").status().code(), StatusCode::kNotFound);

  // A part that keeps failing ends the multipart upload with an abort, and no object. (s3rver
  // 3.7.1 has no AbortMultipartUpload: it answers 405, which the message reports.)
  proxy().Arm("mode=error&count=100&match=partNumber=2&status=503&code=SlowDown");
  s = store->Put("r/multi.bin", RandomBytes(5 * kMiB + 10, 9));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find(Display("r/multi.bin") + ": PUT (multipart upload of 5242890 bytes in 2 parts), part 2 "
                                                      "failed: 503 SlowDown"),
            std::string::npos)
      << s.ToString();
  EXPECT_NE(s.message().find("AbortMultipartUpload"), std::string::npos) << s.ToString();
  EXPECT_EQ(proxy().Kind("abort_multipart"), 1);
  EXPECT_EQ(proxy().Kind("complete_multipart"), 0);
  proxy().Arm("mode=pass");
  EXPECT_EQ(store->Get("r/multi.bin").status().code(), StatusCode::kNotFound);
}

TEST_F(S3StoreTest, RetriesSlowStalledAndDroppedAnswers) {
  S3Options o = Options();
  o.request_timeout_s = 1;
  auto store = Open(o);
  ASSERT_NE(store, nullptr);
  const std::string data = RandomBytes(200000, 10);
  ASSERT_TRUE(store->Put("t/x.bin", data).ok());
  for (const std::string fault : {"mode=slow&delay=2.5", "mode=stall&delay=2.5", "mode=drop"}) {
    proxy().Arm(fault + "&count=1&method=GET");
    const auto start = Clock::now();
    auto got = store->Get("t/x.bin");
    ASSERT_TRUE(got.ok()) << fault << ": " << got.status().ToString();
    EXPECT_TRUE(*got == data) << fault;
    EXPECT_EQ(proxy().Kind("get"), 2) << fault;
    EXPECT_LT(Since(start), 2.4) << fault << ": the retry should not wait for the slow answer";
  }
  // A dropped range of a parallel read is read again.
  const std::string big = RandomBytes(10 * kMiB + 1, 11);
  ASSERT_TRUE(store->Put("t/big.bin", big).ok());
  proxy().Arm("mode=drop&count=2&method=GET");
  auto got = store->Get("t/big.bin");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(*got == big);
  EXPECT_EQ(proxy().Kind("get"), 5);
}

// Its own s3rver and proxy: the server is killed while a part upload is held in the proxy.
TEST_F(S3StoreTest, ServerKilledMidUploadFailsClearlyAndKeepsEarlierObjects) {
  testing_util::TestDir tmp("tf_s3_kill");
  S3rver s3rver;
  FaultProxy proxy;
  const int s3_port = FreePort(), proxy_port = FreePort();
  ASSERT_TRUE(s3rver.Start(tmp.path() + "/data", s3_port, tmp.path() + "/s3rver.log"));
  ASSERT_TRUE(proxy.Start(proxy_port, s3_port, tmp.path() + "/proxy.log"));
  S3Options o = Options();
  o.endpoint = proxy.endpoint();
  o.parallelism = 1;
  o.max_attempts = 3;
  o.connect_timeout_s = 1;
  o.request_timeout_s = 5;
  auto store = Open(o);
  ASSERT_NE(store, nullptr);
  const std::string before = RandomBytes(300000, 12);
  ASSERT_TRUE(store->Put("before.bin", before).ok());

  proxy.Arm("mode=hold&match=partNumber&count=1");  // part 1 goes through, part 2 is held
  Status put;
  std::thread writer([&] { put = store->Put("big.bin", RandomBytes(15 * kMiB, 13)); });
  const auto wait_start = Clock::now();
  while (!proxy.Stats().value("holding", false) && Since(wait_start) < 20) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const bool held = proxy.Stats().value("holding", false);
  s3rver.Kill();
  const auto killed = Clock::now();
  proxy.Control("release");
  writer.join();
  ASSERT_TRUE(held) << "part 2 never reached the proxy";
  EXPECT_LT(Since(killed), 10.0);
  EXPECT_EQ(put.code(), StatusCode::kUnavailable) << put.ToString();
  EXPECT_NE(put.message().find(fmt::format("{}/big.bin: PUT (multipart upload", Url())), std::string::npos)
      << put.ToString();
  EXPECT_NE(put.message().find("part 2 failed"), std::string::npos) << put.ToString();

  ASSERT_TRUE(s3rver.Restart());  // same directory, same port
  proxy.Arm("mode=pass");
  auto got = store->Get("before.bin");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(*got == before);
  EXPECT_EQ(store->Get("big.bin").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(*store->List(""), std::vector<std::string>{"before.bin"});
}

// Many threads on one store, as object_store.h allows.
TEST_F(S3StoreTest, ConcurrentOperationsOnDistinctKeys) {
  auto store = Open(Options());
  ASSERT_NE(store, nullptr);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 4; ++i) {
        const std::string key = fmt::format("c/{}-{}", t, i);
        const std::string data = RandomBytes(1000 + 37 * t + i, 100 + t * 10 + i);
        if (!store->Put(key, data).ok()) ++failures;
        auto got = store->Get(key);
        if (!got.ok() || *got != data) ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(store->List("c/")->size(), 24u);
}

}  // namespace
}  // namespace tf::checkpoint
