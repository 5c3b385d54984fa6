// Reading the flight records of all ranks (dtensor/flight_recorder.h): the first call
// of each group on which the ranks disagree, the rank that never arrived, the message
// nobody sent, the ranks without a record.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "dtensor/flight_recorder.h"
#include "util/check.h"

namespace dtensor {

namespace {

using json = nlohmann::json;
constexpr const char* kOp = "analyze_flight_records";

struct Call {
  int64_t seq = 0;
  std::string op, dtype, state, context;
  int64_t in = 0, out = 0, root = -1, peer = -1, tag = 0, issued_us = 0;
  bool p2p = false;
};

// One rank's view of one group.
struct View {
  int world_rank = 0, group_rank = 0;
  int64_t calls = 0;
  std::vector<Call> collectives, p2p;  // in the order issued
  const Call* at(int64_t seq) const {
    for (const Call& c : collectives) {
      if (c.seq == seq) return &c;
    }
    return nullptr;
  }
  int64_t first() const { return collectives.empty() ? calls : collectives.front().seq; }
};

struct GroupKey {
  std::string name;
  std::vector<int> ranks;
  auto operator<=>(const GroupKey&) const = default;
};

struct Dump {
  int rank = 0, world_size = 0;
  std::string path;
  std::vector<std::pair<GroupKey, View>> groups;
  const Call* latest = nullptr;  // the last call it issued, in any group
  std::string latest_group;
};

std::string group_label(const GroupKey& key) {
  std::ostringstream os;
  os << "group '" << key.name << "'";
  if (!key.ranks.empty()) {
    os << " (ranks ";
    for (size_t i = 0; i < key.ranks.size(); ++i) os << (i ? "," : "") << key.ranks[i];
    os << ")";
  }
  return os.str();
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::ostringstream os;
  os << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  return os.str();
}

std::string describe(const Call& c) {
  std::ostringstream os;
  os << c.op << "(" << c.dtype;
  if (c.p2p) {
    os << ", " << (c.op == "send" ? c.in : c.out) << " elements, " << (c.op == "send" ? "to" : "from") << " group rank "
       << c.peer << ", tag " << c.tag;
  } else if (c.op != "barrier" && c.op != "split") {
    os << ", " << c.in << " -> " << c.out << " elements";
  }
  if (c.root >= 0) os << ", root " << c.root;
  os << ")";
  if (!c.context.empty()) os << " in " << c.context;
  os << ", " << c.state;
  return os.str();
}

// What must be equal on every rank of a collective (counts only where every rank
// passes the same number of elements).
std::string signature(const Call& c) {
  const bool same_counts = c.op == "all_reduce" || c.op == "broadcast";
  return c.op + "/" + c.dtype + "/" + std::to_string(c.root) + (same_counts ? "/" + std::to_string(c.in) : "");
}

Call parse_call(const json& e, const std::string& where) {
  Call c;
  c.seq = e.at("seq").get<int64_t>();
  c.op = e.at("op").get<std::string>();
  c.dtype = e.at("dtype").get<std::string>();
  c.state = e.at("state").get<std::string>();
  c.in = e.at("in").get<int64_t>();
  c.out = e.at("out").get<int64_t>();
  c.issued_us = e.at("issued_us").get<int64_t>();
  c.root = e.value("root", int64_t{-1});
  c.p2p = e.contains("peer");
  c.peer = e.value("peer", int64_t{-1});
  c.tag = e.value("tag", int64_t{0});
  c.context = e.value("context", std::string());
  DT_CHECK_ARG(c.state == "issued" || c.state == "started" || c.state == "completed" || c.state == "failed", kOp, where,
               ": unknown state '", c.state, "'");
  return c;
}

Dump read_dump(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  Dump d;
  d.path = path.string();
  try {
    const json j = json::parse(text.str());
    DT_CHECK_ARG(j.value("format", "") == "dtensor-flight-record", kOp, d.path, ": not a dtensor flight record");
    d.rank = j.at("rank").get<int>();
    d.world_size = j.at("world_size").get<int>();
    for (const json& g : j.at("groups")) {
      GroupKey key{g.at("name").get<std::string>(), g.at("ranks").get<std::vector<int>>()};
      View v;
      v.world_rank = d.rank;
      v.group_rank = g.at("rank").get<int>();
      v.calls = g.at("calls").get<int64_t>();
      for (const json& e : g.at("entries")) {
        Call c = parse_call(e, d.path);
        (c.p2p ? v.p2p : v.collectives).push_back(std::move(c));
      }
      d.groups.emplace_back(std::move(key), std::move(v));
    }
  } catch (const json::exception& e) {
    throw std::invalid_argument(detail::concat("[", kOp, "] ", d.path, ": not a flight record: ", e.what()));
  }
  for (const auto& [key, v] : d.groups) {
    for (const std::vector<Call>* calls : {&v.collectives, &v.p2p}) {
      for (const Call& c : *calls) {
        if (!d.latest || c.issued_us > d.latest->issued_us) {
          d.latest = &c;
          d.latest_group = group_label(key);
        }
      }
    }
  }
  return d;
}

// Where a rank was last: its newest call in any group.
std::string whereabouts(const Dump& d) {
  if (!d.latest) return detail::concat("rank ", d.rank, " made no communication call");
  return detail::concat("rank ", d.rank, "'s last call was #", d.latest->seq, " of ", d.latest_group, ": ",
                        describe(*d.latest));
}

class Analyzer {
 public:
  explicit Analyzer(std::vector<Dump> dumps) : dumps_(std::move(dumps)) {
    for (const Dump& d : dumps_) {
      by_rank_[d.rank] = &d;
      result_.world_size = std::max(result_.world_size, d.world_size);
      result_.ranks_read.push_back(d.rank);
      for (const auto& [key, v] : d.groups) groups_[key].push_back(&v);
    }
  }

  FlightAnalysis run() {
    for (int r = 0; r < result_.world_size; ++r) {
      if (!by_rank_.count(r)) {
        add(FlightFinding::Kind::NoRecord, "", -1, {r}, 0,
            detail::concat("rank ", r, " left no record (it was killed, or hung where nothing could dump)"));
      }
    }
    for (const auto& [key, views] : groups_) {
      scan_collectives(key, views);
      scan_p2p(key, views);
    }
    std::stable_sort(result_.findings.begin(), result_.findings.end(), [](const auto& a, const auto& b) {
      const bool a_none = a.kind == FlightFinding::Kind::NoRecord, b_none = b.kind == FlightFinding::Kind::NoRecord;
      if (a_none != b_none) return !a_none;
      return a.issued_us < b.issued_us;
    });
    std::set<int> suspects;
    for (const FlightFinding& f : result_.findings) {
      if (f.kind != FlightFinding::Kind::NeverArrived && f.kind != FlightFinding::Kind::NoRecord) continue;
      for (int r : f.ranks) {
        const auto it = by_rank_.find(r);
        if (it == by_rank_.end() || !it->second->latest || it->second->latest->state == "completed") {
          suspects.insert(r);
        }
      }
    }
    result_.suspects.assign(suspects.begin(), suspects.end());
    return std::move(result_);
  }

 private:
  void add(FlightFinding::Kind kind, std::string group, int64_t seq, std::vector<int> ranks, int64_t issued_us,
           std::string message) {
    result_.findings.push_back({kind, std::move(group), seq, std::move(ranks), issued_us, std::move(message)});
  }

  // The views of the group's members, with empty ones for members that dumped but
  // never made a call in it (a group is recorded from its first call).
  std::vector<View> members(const GroupKey& key, const std::vector<const View*>& views) const {
    std::vector<View> all;
    for (const View* v : views) all.push_back(*v);
    for (size_t g = 0; g < key.ranks.size(); ++g) {
      const int r = key.ranks[g];
      const bool seen = std::any_of(views.begin(), views.end(), [&](const View* v) { return v->world_rank == r; });
      if (!seen && by_rank_.count(r)) all.push_back(View{r, static_cast<int>(g), 0, {}, {}});
    }
    std::sort(all.begin(), all.end(), [](const View& a, const View& b) { return a.world_rank < b.world_rank; });
    return all;
  }

  std::vector<int> silent_members(const GroupKey& key) const {
    std::vector<int> silent;
    for (int r : key.ranks) {
      if (!by_rank_.count(r)) silent.push_back(r);
    }
    return silent;
  }

  void scan_collectives(const GroupKey& key, const std::vector<const View*>& present) {
    const std::vector<View> views = members(key, present);
    const std::string label = group_label(key);
    int64_t lo = 0, hi = -1;
    for (const View& v : views) {
      lo = std::max(lo, v.first());
      hi = std::max(hi, v.calls - 1);
    }
    const Call* first_failed = nullptr;
    std::vector<int> failed_ranks;
    for (int64_t s = lo; s <= hi; ++s) {
      std::map<std::string, std::vector<int>> signatures;
      std::map<std::string, const Call*> example;
      std::vector<int> arrived, missing;
      int64_t issued = INT64_MAX;
      for (const View& v : views) {
        const Call* c = s < v.calls ? v.at(s) : nullptr;
        if (!c) {
          if (s >= v.calls) missing.push_back(v.world_rank);
          continue;
        }
        arrived.push_back(v.world_rank);
        signatures[signature(*c)].push_back(v.world_rank);
        example[signature(*c)] = c;
        issued = std::min(issued, c->issued_us);
        if (c->state == "failed" && (!first_failed || first_failed->seq == s)) {
          first_failed = c;
          failed_ranks.push_back(v.world_rank);
        }
      }
      if (signatures.size() > 1) {
        std::ostringstream os;
        os << "ranks disagree at call #" << s << " of " << label << ":";
        std::vector<int> ranks;
        for (const auto& [sig, rs] : signatures) {
          os << " " << ranks_text(rs) << " " << describe(*example[sig]) << ";";
          ranks.insert(ranks.end(), rs.begin(), rs.end());
        }
        std::string text = os.str();
        text.back() = '.';
        add(FlightFinding::Kind::Mismatch, key.name, s, ranks, issued, text);
        return;
      }
      if (!missing.empty() && !arrived.empty()) {
        std::ostringstream os;
        os << ranks_text(missing) << " never arrived at call #" << s << " of " << label << ", "
           << describe(*example.begin()->second) << ", where " << ranks_text(arrived)
           << (arrived.size() == 1 ? " waits" : " wait") << ".";
        for (int r : missing) {
          const View& v = *std::find_if(views.begin(), views.end(), [&](const View& x) { return x.world_rank == r; });
          const Call* last = v.calls > 0 ? v.at(v.calls - 1) : nullptr;
          const Dump& dump = *by_rank_.at(r);
          if (v.calls == 0) {
            os << " Rank " << r << " made no call in this group; " << whereabouts(dump) << ".";
          } else if (last && dump.latest && last->issued_us == dump.latest->issued_us &&
                     last->seq == dump.latest->seq && last->op == dump.latest->op) {
            os << " Rank " << r << "'s last call, in this group or any, was #" << last->seq << ", " << describe(*last)
               << ".";
          } else {
            if (last)
              os << " Rank " << r << "'s last call in this group was #" << last->seq << ", " << describe(*last) << ";";
            os << " " << whereabouts(dump) << ".";
          }
        }
        const std::vector<int> silent = silent_members(key);
        if (!silent.empty()) os << " No record from " << ranks_text(silent) << " of the group.";
        add(FlightFinding::Kind::NeverArrived, key.name, s, missing, issued, os.str());
        return;
      }
    }
    // Every member that left a record waits in the group's last call: the silent ones
    // (killed before they could dump, or hung where nothing could) are the suspects.
    const std::vector<int> silent = silent_members(key);
    if (!silent.empty() && hi >= 0) {
      std::vector<int> waiting;
      const Call* last = nullptr;
      for (const View& v : views) {
        const Call* c = v.calls - 1 == hi ? v.at(hi) : nullptr;
        if (c && c->state != "completed") {
          waiting.push_back(v.world_rank);
          last = c;
        }
      }
      if (last && waiting.size() == views.size()) {
        add(FlightFinding::Kind::NeverArrived, key.name, hi, silent, last->issued_us,
            detail::concat(ranks_text(waiting), " wait in call #", hi, " of ", label, ", ", describe(*last), "; ",
                           ranks_text(silent),
                           " of the group left no record: ", silent.size() == 1 ? "it is the one" : "they are the ones",
                           " that did not arrive (killed, or hung where nothing could dump)."));
        return;
      }
    }
    if (first_failed) {
      add(FlightFinding::Kind::Failed, key.name, first_failed->seq, failed_ranks, first_failed->issued_us,
          detail::concat("call #", first_failed->seq, " of ", label, " failed on ", ranks_text(failed_ranks), ": ",
                         describe(*first_failed),
                         " (every member made it: the error each rank printed says why; a timeout here means a "
                         "member stopped inside the call)."));
    }
  }

  void scan_p2p(const GroupKey& key, const std::vector<const View*>& views) {
    const std::string label = group_label(key);
    for (const View* v : views) {
      for (const Call& c : v->p2p) {
        if (c.state == "completed") continue;
        const bool is_send = c.op == "send";
        const int peer_world = c.peer < static_cast<int64_t>(key.ranks.size()) ? key.ranks[c.peer] : -1;
        const auto peer_dump = by_rank_.find(peer_world);
        std::ostringstream os;
        os << "rank " << v->world_rank << " waits in " << describe(c) << " (message #" << c.seq << " " << label << ")";
        if (peer_dump == by_rank_.end()) {
          os << "; rank " << peer_world << " left no record.";
          add(FlightFinding::Kind::Unmatched, key.name, c.seq, {v->world_rank, peer_world}, c.issued_us, os.str());
          continue;
        }
        int64_t posted = 0;
        const Call* match = nullptr;
        for (const auto& [k, pv] : peer_dump->second->groups) {
          if (!(k == key)) continue;
          for (const Call& m : pv.p2p) {
            if ((m.op == "send") == is_send || m.peer != v->group_rank || m.tag != c.tag) continue;
            ++posted;
            if (m.seq == c.seq) match = &m;
          }
        }
        if (match) continue;  // posted on both sides: in flight, not unmatched
        os << ", which rank " << peer_world << " never posted: " << (posted ? "its record holds " : "it made ")
           << posted << (is_send ? " receive" : " send") << (posted == 1 ? "" : "s") << " with that tag "
           << (is_send ? "from" : "to") << " rank " << v->world_rank << ". " << whereabouts(*peer_dump->second) << ".";
        add(FlightFinding::Kind::Unmatched, key.name, c.seq, {v->world_rank, peer_world}, c.issued_us, os.str());
        break;  // the first waiting message of each rank and group is the one that matters
      }
    }
  }

  std::vector<Dump> dumps_;
  std::map<int, const Dump*> by_rank_;
  std::map<GroupKey, std::vector<const View*>> groups_;
  FlightAnalysis result_;
};

}  // namespace

FlightAnalysis analyze_flight_records(const std::string& dir) {
  namespace fs = std::filesystem;
  DT_CHECK_ARG(fs::is_directory(dir), kOp, "expected a directory of rank-<k>.json dumps, got '", dir, "'");
  const std::regex name("rank-([0-9]+)\\.json");
  std::vector<Dump> dumps;
  std::set<int> seen;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!std::regex_match(entry.path().filename().string(), name)) continue;
    Dump d = read_dump(entry.path());
    DT_CHECK_ARG(seen.insert(d.rank).second, kOp, d.path, ": a second record of rank ", d.rank);
    dumps.push_back(std::move(d));
  }
  if (dumps.empty()) throw std::runtime_error(detail::concat("[", kOp, "] no rank-<k>.json in ", dir));
  std::sort(dumps.begin(), dumps.end(), [](const Dump& a, const Dump& b) { return a.rank < b.rank; });
  FlightAnalysis result = Analyzer(std::move(dumps)).run();
  std::sort(result.ranks_read.begin(), result.ranks_read.end());
  return result;
}

std::string FlightAnalysis::report() const {
  std::ostringstream os;
  os << "flight records of " << ranks_read.size() << " of " << world_size << " ranks\n";
  if (findings.empty()) {
    os << "consistent: every group's calls agree on every rank that made them, and no rank waits for one that "
          "never came\n";
    return os.str();
  }
  if (!suspects.empty()) {
    os << "suspect: " << ranks_text(suspects)
       << (suspects.size() == 1 ? ", which stopped communicating (its last call completed) while peers waited for it"
                                : ", which stopped communicating (each one's last call completed) while peers waited")
       << "\n";
  }
  for (size_t i = 0; i < findings.size(); ++i) {
    os << (i == 0 ? "first: " : "then:  ") << findings[i].message << "\n";
  }
  return os.str();
}

}  // namespace dtensor
