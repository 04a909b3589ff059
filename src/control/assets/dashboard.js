// Refreshes the dashboard's numbers from /v1/dashboard/stats while the page is visible, and
// shows the explain form's answers in place. Everything else is rendered by the server.
(function () {
  "use strict";
  var pct = function (v) { return v == null ? "–" : (v * 100).toFixed(1) + " %"; };
  var ms = function (v) { return v == null ? "–" : v.toFixed(1) + " ms"; };
  var p99 = function (r) {
    if (!r || !r.requests) return "–";
    return r.p99_ms == null ? "> 10 s" : "≤ " + r.p99_ms + " ms";
  };
  function show(key, r) {
    var cells = document.querySelectorAll("td[data-r]");
    for (var i = 0; i < cells.length; i++) {
      var c = cells[i];
      if (c.getAttribute("data-r") !== key) continue;
      var k = c.getAttribute("data-k");
      if (k === "rps") c.textContent = r ? r.rps.toFixed(2) : "0.00";
      else if (k === "error_rate") c.textContent = pct(r && r.error_rate);
      else if (k === "mean_ms") c.textContent = ms(r && r.mean_ms);
      else if (k === "p99_ms") c.textContent = p99(r);
    }
  }
  function spark(series, max) {
    var line = document.querySelector("#spark polyline");
    if (!line) return;
    var n = 150, top = 1, pts = [];
    for (var i = 0; i < series.length; i++) top = Math.max(top, series[i].rps);
    var start = n - series.length;
    for (var j = 0; j < series.length; j++) {
      pts.push(((start + j) / (n - 1) * 600).toFixed(1) + "," + (60 - series[j].rps / top * 56 - 2).toFixed(1));
    }
    line.setAttribute("points", pts.join(" "));
  }
  function refresh() {
    if (document.hidden) return;
    fetch("/v1/dashboard/stats", { cache: "no-store" }).then(function (r) { return r.json(); }).then(function (s) {
      var seen = {};
      show("*", s.total);
      for (var i = 0; i < s.routes.length; i++) { show(s.routes[i].id, s.routes[i]); seen[s.routes[i].id] = true; }
      var cells = document.querySelectorAll("td[data-k=rps]");
      for (var j = 0; j < cells.length; j++) {
        var key = cells[j].getAttribute("data-r");
        if (key !== "*" && !seen[key]) show(key, null);
      }
      var w = document.getElementById("window");
      if (w) w.textContent = "(last " + Math.round(s.window_seconds) + " s)";
      spark(s.series);
      document.body.setAttribute("data-samples", String(s.samples));
    }).catch(function () {});
  }
  setInterval(refresh, 2000);
  document.addEventListener("visibilitychange", refresh);
  refresh();

  var form = document.getElementById("explain-form");
  var out = document.getElementById("explain-out");
  if (form && out) {
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var f = new FormData(form), body = {}, headers = {};
      ["method", "uri", "host", "client_ip"].forEach(function (k) {
        var v = String(f.get(k) || "").trim();
        if (v) body[k] = v;
      });
      String(f.get("headers") || "").split("\n").forEach(function (line) {
        var at = line.indexOf(":");
        if (at > 0) headers[line.slice(0, at).trim()] = line.slice(at + 1).trim();
      });
      if (Object.keys(headers).length) body.headers = headers;
      fetch("/v1/explain", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) })
        .then(function (r) { return r.json(); })
        .then(function (e) {
          out.textContent = "";
          var p = document.createElement("p");
          p.className = "verdict";
          p.textContent = e.verdict ? e.verdict.summary : e.error_msg;
          var pre = document.createElement("pre");
          pre.textContent = JSON.stringify(e, null, 2);
          out.appendChild(p);
          out.appendChild(pre);
        });
    });
  }
})();
