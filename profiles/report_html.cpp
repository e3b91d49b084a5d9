// The HTML report: one self-contained file (inline CSS and SVG, no script, no network) that a
// person reads at a glance: what to change (the Advice section, first), where CPU time goes by op
// and category, the LayerNorm shapes with their Run%, and step times per rank.
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "profiles/report.h"

namespace hfnn::profiles {
namespace {

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// A horizontal bar for a share in [0, 1], as inline SVG.
std::string bar(double share, const char* color, int width = 240) {
  const double w = std::clamp(share, 0.0, 1.0) * width;
  return fmt::format(R"(<svg class="bar" width="{0}" height="14" role="img" aria-label="{2:.1f}%"><rect width="{0}" height="14" fill="#eef1f5"/><rect width="{1:.1f}" height="14" fill="{3}"/></svg>)",
                     width, w, 100 * share, color);
}

// A colour per category (profiles/kernel_names.h's kCategories), the same for ops and kernels.
const char* category_color(const std::string& c) {
  if (c == "gemm") return "#1c7ed6";
  if (c == "conv") return "#1864ab";
  if (c == "attention") return "#5f3dc4";
  if (c == "layer_norm") return "#d9480f";
  if (c == "norm") return "#f59f00";
  if (c == "softmax") return "#ae3ec9";
  if (c == "reduction") return "#2b8a3e";
  if (c == "elementwise") return "#74b816";
  if (c == "copy") return "#e64980";
  if (c == "communication") return "#c92a2a";
  if (c == "lstm") return "#0b7285";
  return "#868e96";
}

// The Advice section: what to change, each with its evidence and saving (profiles/advice.h).
std::string advice_html(const nlohmann::json& r) {
  std::string h = "<h2 id=\"advice\">Advice</h2>\n";
  if (r["advice"].empty()) {
    std::string rules;
    for (const auto& id : r.value("advice_rules", nlohmann::json::array()))
      rules += (rules.empty() ? "" : ", ") + fmt::format("<code>{}</code>", escape(id.get<std::string>()));
    return h + "<p>None: this run's numbers trigger none of the rules (" + rules + ").</p>\n";
  }
  h += "<ol class=\"advice\">\n";
  for (const auto& a : r["advice"])
    h += fmt::format("<li id=\"advice-{0}\"><b>{1}</b> <span class=\"id\">{0}</span>"
                     "<div class=\"do\">Do: {2}</div><div class=\"evidence\">Evidence: {3}</div>"
                     "<div class=\"saving\">{4}</div></li>\n",
                     escape(a["id"].get<std::string>()), escape(a["title"].get<std::string>()),
                     escape(a["action"].get<std::string>()), escape(a["evidence"].get<std::string>()),
                     escape(saving_text(a)));
  return h + "</ol>\n";
}

}  // namespace

std::string report_html(const nlohmann::json& r) {
  const auto& run = r["run"];
  std::string h;
  h += R"(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>hfnn profile</title>
<style>
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1100px;color:#212529;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dee2e6;padding-bottom:4px}
.meta{color:#495057}.note{background:#fff9db;border-left:4px solid #fab005;padding:6px 10px;margin:10px 0}
table{border-collapse:collapse;width:100%}th,td{padding:4px 8px;text-align:left;border-bottom:1px solid #f1f3f5;white-space:nowrap}
th{color:#495057;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
.name{max-width:460px;overflow:hidden;text-overflow:ellipsis}.bar{vertical-align:middle}
.stack{display:flex;height:22px;border-radius:4px;overflow:hidden;margin:6px 0}.legend span{margin-right:14px;white-space:nowrap}
.swatch{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px}
.advice li{margin:0 0 10px}.advice .do{margin:2px 0}.advice .evidence,.advice .saving{color:#495057;margin:2px 0}
.advice .id{color:#868e96;font-size:12px}
</style></head><body>
)";
  h += fmt::format("<h1>hfnn profile &middot; run {}</h1>\n<div class=\"meta\"><code>{}</code><br>exit code {} &middot; torch {} &middot; hfnn {} &middot; GPU {}</div>\n",
                   run["id"].get<int64_t>(), escape(run["command"].get<std::string>()), run["exit_code"].get<int64_t>(),
                   escape(run["torch"].get<std::string>()), escape(run["hfnn"].get<std::string>()),
                   run["gpu"].is_null() ? std::string("none") : escape(run["gpu"].get<std::string>()));
  h += fmt::format("<div class=\"note\">{}</div>\n", escape(r["cuda_note"].get<std::string>()));
  if (r.contains("profiler_cost"))
    h += fmt::format("<div class=\"note\" id=\"profiler-cost\">{}</div>\n",
                     escape(r["profiler_cost"]["text"].get<std::string>()));
  if (r.contains("advice")) h += advice_html(r);

  // Categories as one stacked bar.
  std::vector<std::pair<double, std::string>> cats;
  for (const auto& [k, v] : r["categories"].items()) cats.emplace_back(v.get<double>(), k);
  std::sort(cats.rbegin(), cats.rend());
  h += "<h2>Where the time goes</h2>\n<div class=\"stack\">";
  for (const auto& [v, k] : cats)
    h += fmt::format("<div title=\"{0} {1:.1f}%\" style=\"width:{1:.2f}%;background:{2}\"></div>", escape(k), 100 * v,
                     category_color(k));
  h += "</div>\n<div class=\"legend\">";
  for (const auto& [v, k] : cats)
    h += fmt::format("<span><i class=\"swatch\" style=\"background:{}\"></i>{} {:.1f}%</span>", category_color(k),
                     escape(k), 100 * v);
  h += "</div>\n";

  const bool cuda = r["time_basis"] == "cuda";
  const std::string self_key = cuda ? "cuda_self_us" : "cpu_self_us", total_key = cuda ? "cuda_total_us" : "cpu_total_us";
  h += fmt::format("<h2>Top ops by {} self time</h2>\n<table><tr><th>op</th><th>phase</th><th class=\"num\">calls</th>"
                   "<th class=\"num\">self ms</th><th>share</th><th class=\"num\">total ms</th>{}</tr>\n",
                   cuda ? "CUDA" : "CPU", cuda ? "<th class=\"num\">CPU self ms</th>" : "");
  for (const auto& o : r["ops"]) {
    const std::string name = o["name"].get<std::string>();
    h += fmt::format("<tr><td class=\"name\" title=\"{0}\">{0}</td><td>{1}</td><td class=\"num\">{2}</td>"
                     "<td class=\"num\">{3:.3f}</td><td>{4} {5:.1f}%</td><td class=\"num\">{6:.3f}</td>{7}</tr>\n",
                     escape(name), escape(o["phase"].get<std::string>()), o["calls"].get<int64_t>(),
                     o[self_key].get<double>() / 1e3, bar(o["share"].get<double>(), category_color(o["category"].get<std::string>())),
                     100 * o["share"].get<double>(), o[total_key].get<double>() / 1e3,
                     cuda ? fmt::format("<td class=\"num\">{:.3f}</td>", o["cpu_self_us"].get<double>() / 1e3) : std::string());
  }
  h += "</table>\n";
  if (!r["kernels"].empty()) {
    // The short name as torch.profiler shows it; the whole demangled name on hover.
    h += "<h2>Top kernels by CUDA time</h2>\n<table><tr><th>kernel</th><th>category</th><th>library</th>"
         "<th class=\"num\">calls</th><th class=\"num\">CUDA ms</th><th>share</th></tr>\n";
    for (const auto& k : r["kernels"])
      h += fmt::format("<tr><td class=\"name\" title=\"{}\"><code>{}</code></td><td>{}</td><td>{}</td>"
                       "<td class=\"num\">{}</td><td class=\"num\">{:.3f}</td><td>{} {:.1f}%</td></tr>\n",
                       escape(k["name"].get<std::string>()), escape(k["short_name"].get<std::string>()),
                       escape(k["category"].get<std::string>()), escape(k["library"].get<std::string>()),
                       k["calls"].get<int64_t>(), k["cuda_us"].get<double>() / 1e3,
                       bar(k["share"].get<double>(), category_color(k["category"].get<std::string>())),
                       100 * k["share"].get<double>());
    h += "</table>\n";
  }

  bool any_layer_norm = false;
  for (const auto& s : r["shapes"]) any_layer_norm = any_layer_norm || s["op"] == "layer_norm";
  h += "<h2>LayerNorm input shapes</h2>\n";
  if (!any_layer_norm) {
    h += "<p>No LayerNorm ran in the recorded steps: nothing for <code>hfnn tune</code> to tune.</p>\n";
  } else {
    h += "<table><tr><th>shape</th><th>normalized</th><th>dtype</th><th>affine</th><th class=\"num\">fwd calls</th>"
         "<th>Run%</th><th class=\"num\">bwd calls</th><th class=\"num\">" +
         std::string(cuda ? "CUDA" : "CPU") + " ms</th><th>share of LayerNorm time</th></tr>\n";
    for (const auto& s : r["shapes"])
      if (s["op"] == "layer_norm")
        h += fmt::format("<tr><td><code>{}</code></td><td><code>{}</code></td><td>{}</td><td>{}</td><td class=\"num\">{}</td>"
                         "<td>{} {:.2f}%</td><td class=\"num\">{}</td><td class=\"num\">{:.3f}</td><td>{} {:.1f}%</td></tr>\n",
                         escape(s["shape"].get<std::string>()), escape(s["normalized_shape"].get<std::string>()),
                         escape(s["dtype"].get<std::string>()), s["affine"].get<bool>() ? "yes" : "no",
                         s["fwd_calls"].get<int64_t>(), bar(s["run_pct"].get<double>() / 100, "#d9480f", 160),
                         s["run_pct"].get<double>(), s["bwd_calls"].get<int64_t>(), s["time_us"].get<double>() / 1e3,
                         bar(s["time_share"].get<double>(), "#d9480f", 160), 100 * s["time_share"].get<double>());
    h += "</table>\n";
  }
  for (const auto& [op, title] : kModuleShapeOps) {
    bool any = false;
    for (const auto& s : r["shapes"]) any = any || s["op"] == op;
    if (!any) continue;
    h += fmt::format("<h2>{}</h2>\n<table><tr><th>input</th><th>dtype</th><th>settings</th><th class=\"num\">calls</th>"
                     "<th>Run%</th><th class=\"num\">{} ms</th><th>share</th></tr>\n", title, cuda ? "CUDA" : "CPU");
    const char* color = category_color(op_category(op));
    for (const auto& s : r["shapes"])
      if (s["op"] == op)
        h += fmt::format("<tr><td><code>{}</code></td><td>{}</td><td><code>{}</code></td><td class=\"num\">{}</td>"
                         "<td>{} {:.2f}%</td><td class=\"num\">{:.3f}</td><td>{} {:.1f}%</td></tr>\n",
                         escape(s["shape"].get<std::string>()), escape(s["dtype"].get<std::string>()),
                         escape(s["flags"].get<std::string>()), s["fwd_calls"].get<int64_t>(),
                         bar(s["run_pct"].get<double>() / 100, color, 160), s["run_pct"].get<double>(),
                         s["time_us"].get<double>() / 1e3, bar(s["time_share"].get<double>(), color, 160),
                         100 * s["time_share"].get<double>());
    h += "</table>\n";
  }

  h += "<h2>Step time per rank</h2>\n";
  if (r["steps"].empty()) {
    h += "<p>No step boundary was seen (no <code>optimizer.step()</code> or <code>hfnn.step()</code>): the numbers above cover the whole run.</p>\n";
  } else {
    double longest = 0;
    for (const auto& s : r["steps"]) longest = std::max(longest, s["max_ms"].get<double>());
    h += "<table><tr><th>rank</th><th class=\"num\">steps</th><th class=\"num\">mean ms</th><th>mean (bar) and range</th>"
         "<th class=\"num\">min ms</th><th class=\"num\">max ms</th><th class=\"num\">plain step ms</th>"
         "<th>GPU busy</th><th>communication</th></tr>\n";
    for (const auto& s : r["steps"]) {
      const double scale = longest > 0 ? 300.0 / longest : 0;
      const double mean = s["mean_ms"].get<double>(), lo = s["min_ms"].get<double>(), hi = s["max_ms"].get<double>();
      const auto plain = s.value("plain_step_ms", nlohmann::json());
      h += fmt::format("<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{:.2f}</td><td><svg width=\"300\" height=\"14\" "
                       "role=\"img\" aria-label=\"{:.2f} ms\"><rect width=\"300\" height=\"14\" fill=\"#eef1f5\"/><rect width=\"{:.1f}\" "
                       "height=\"14\" fill=\"#1c7ed6\"/><line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"7\" y2=\"7\" stroke=\"#212529\" "
                       "stroke-width=\"2\"/></svg></td><td class=\"num\">{:.2f}</td><td class=\"num\">{:.2f}</td>"
                       "<td class=\"num\">{}</td><td>{}</td><td>{} {:.1f}%</td></tr>\n",
                       s["rank"].get<int64_t>(), s["steps"].get<int64_t>(), mean, mean, mean * scale, lo * scale,
                       hi * scale, lo, hi,
                       plain.is_number() ? fmt::format("{:.2f} ({} steps)", plain.get<double>(), s["plain_steps"].get<int64_t>())
                                         : std::string("&ndash;"),
                       s["gpu_busy_ms"].is_number() ? escape(gpu_busy_text(s)) : std::string("&ndash;"),
                       bar(s["communication_share"].get<double>(), category_color("communication"), 120),
                       100 * s["communication_share"].get<double>());
    }
    h += "</table>\n";
  }
  if (r.contains("tune"))
    for (const auto& e : r["tune"]["envs"]) {
      const auto& env = e["env"];
      h += fmt::format("<h2>Tuned on {} (sm {}), CUDA {}, torch {}, hfnn {}</h2>\n",
                       escape(env["gpu"].get<std::string>()), escape(env["compute_capability"].get<std::string>()),
                       escape(env["cuda"].get<std::string>()), escape(env["torch"].get<std::string>()),
                       escape(env["hfnn"].get<std::string>()));
      if (e.contains("projection")) {
        const auto& pr = e["projection"];
        h += fmt::format("<p>Projected step time <b>{:.2f} ms &rarr; {:.2f} ms ({})</b>{}: {:.2f} ms per step saved "
                         "by the winners below (measured per call, times calls per step).</p>\n",
                         pr["step_ms"].get<double>(), pr["projected_step_ms"].get<double>(), speedup_text(pr["speedup"]),
                         escape(basis_text(pr)), pr["saved_ms"].get<double>());
        if (pr.contains("torch_ms")) h += "<p>" + escape(ceiling_text(pr)) + "</p>\n";
        if (const std::string note = cpu_bound_note(pr); !note.empty()) h += "<p>" + escape(note) + "</p>\n";
        if (const std::string note = plain_fallback_text(pr); !note.empty()) h += "<p>" + escape(note) + "</p>\n";
      }
      double fastest = 1;
      for (const auto& t : e["rows"]) fastest = std::max(fastest, t["speedup"].get<double>());
      h += "<table><tr><th>key</th><th>dtype</th><th class=\"num\">Run%</th><th class=\"num\">share</th>"
           "<th>pass</th><th class=\"num\">torch &micro;s</th><th class=\"num\">best &micro;s</th><th>winner</th>"
           "<th>speed-up</th></tr>\n";
      for (const auto& t : e["rows"]) {
        const double speedup = t["speedup"].get<double>();
        h += fmt::format("<tr><td><code>{}</code></td><td>{}</td><td class=\"num\">{:.2f}%</td><td class=\"num\">{:.1f}%</td>"
                         "<td>{}</td><td class=\"num\">{:.2f}</td><td class=\"num\">{:.2f}</td><td><code>{}</code></td>"
                         "<td>{} {:.2f}x</td></tr>\n",
                         escape(key_label(t["op"].get<std::string>(), t["key"].get<std::string>())), escape(t["dtype"].get<std::string>()),
                         t["run_pct"].get<double>(), t["share_pct"].get<double>(), escape(t["pass"].get<std::string>()),
                         t["torch_us"].get<double>(), t["best_us"].get<double>(), escape(t["winner"].get<std::string>()),
                         bar(speedup / fastest, category_color(t["op"].get<std::string>()), 120), speedup);
      }
      h += "</table>\n";
    }
  h += "</body></html>\n";
  return h;
}

}  // namespace hfnn::profiles
