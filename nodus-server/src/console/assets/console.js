// The console's only script: a page of running work re-fetches its live part when the
// server says something in the project changed (server-sent events). No data is evaluated:
// the fragment is HTML the server escaped.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live || !window.EventSource || !window.fetch) {
    return;
  }
  var fragment = live.getAttribute("data-fragment");
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
        if (html !== null) {
          live.innerHTML = html;
          live.setAttribute("data-refreshed", String(Date.now()));
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
