// The console's only script: a page of running work re-fetches its live part when the
// server says something in the project changed (server-sent events), until the part says
// it is final. No data is evaluated: the fragment is HTML the server escaped.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live || !window.EventSource || !window.fetch) {
    return;
  }
  // The page's own query (its filters and page) kept, and the fragment asked for.
  var search = window.location.search;
  var fragment = window.location.pathname + (search ? search + "&" : "?") + "fragment=1";
  var busy = false;
  var again = false;
  function refresh() {
    if (busy) {
      again = true;
      return;
    }
    busy = true;
    fetch(fragment, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (response) {
        if (response.status === 401) {
          // The session ended: the page itself goes to sign-in.
          window.location.reload();
          return null;
        }
        return response.ok ? response.text() : null;
      })
      .then(function (html) {
        if (html === null) {
          return;
        }
        // Parsed inert (a template runs nothing, loads nothing), and put in only when it
        // differs: what the reader is looking at stays put until something changed.
        var parsed = document.createElement("template");
        parsed.innerHTML = html;
        if (parsed.innerHTML !== live.innerHTML) {
          live.replaceChildren(parsed.content);
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
  var events = new EventSource(live.getAttribute("data-events"));
  events.addEventListener("change", refresh);
  // Changes missed while the stream was reconnecting.
  events.addEventListener("open", refresh);
})();
