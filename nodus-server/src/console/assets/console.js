// The console's only script: a page of running work re-fetches its live part when the
// server says something in the project changed (server-sent events), until the part says
// it is final; a part marked `data-fragment` (a group's charts, which read every member) is
// fetched once the page is shown, and again after each change. No data is evaluated: the
// fragments are HTML the server escaped.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live || !window.EventSource || !window.fetch) {
    return;
  }
  // Parsed inert (a template runs nothing, loads nothing).
  function parse(html) {
    var parsed = document.createElement("template");
    parsed.innerHTML = html;
    return parsed;
  }
  function get(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } }).then(
      function (response) {
        if (response.status === 401) {
          // The session ended: the page itself goes to sign-in.
          window.location.reload();
          return null;
        }
        return response.ok ? response.text() : null;
      }
    );
  }
  // Each part to fetch separately, put in place when it arrives.
  function loadParts() {
    var parts = live.querySelectorAll("[data-fragment]");
    Array.prototype.forEach.call(parts, function (part) {
      var url = part.getAttribute("data-fragment");
      part.removeAttribute("data-fragment");
      get(url + "?fragment=1")
        .then(function (html) {
          if (html !== null) {
            part.replaceChildren(parse(html).content);
          }
        })
        .catch(function () {});
    });
  }
  // The page's own query (its filters and page) kept, and the fragment asked for.
  var search = window.location.search;
  var fragment = window.location.pathname + (search ? search + "&" : "?") + "fragment=1";
  // The live part as the server last sent it (before its separate parts were put in).
  var shown = live.innerHTML;
  var busy = false;
  var again = false;
  function refresh() {
    if (busy) {
      again = true;
      return;
    }
    busy = true;
    get(fragment)
      .then(function (html) {
        if (html === null) {
          return;
        }
        // Put in only when it differs: what the reader is looking at stays put until
        // something changed.
        var parsed = parse(html);
        if (parsed.innerHTML !== shown) {
          shown = parsed.innerHTML;
          live.replaceChildren(parsed.content);
          loadParts();
        }
        // What the page shows has ended (a finished run): nothing more to listen for.
        if (live.querySelector("[data-final]")) {
          events.close();
        }
      })
      .catch(function () {})
      .then(function () {
        busy = false;
        if (again) {
          again = false;
          refresh();
        }
      });
  }
  loadParts();
  var events = new EventSource(live.getAttribute("data-events"));
  events.addEventListener("change", refresh);
  // Changes missed while the stream was reconnecting.
  events.addEventListener("open", refresh);
})();
