"""Drives sandboxd's web console in Debian's headless Chromium (or, for
`firefox`, its Firefox ESR through geckodriver) for tests/it/ui.rs, which
set up what it looks at through the API.

    drive.py smoke BASE SHOTS
    drive.py full  BASE SHOTS SANDBOX_ID TICKER_COMMAND_ID PORT_URL
    drive.py keyboard BASE SHOTS SANDBOX_ID
    drive.py firefox BASE SHOTS GECKODRIVER SANDBOX_ID TICKER_COMMAND_ID

The admin token comes in SANDBOXD_TOKEN. Each step prints one line,
`ok STEP [what it saw]`. It waits for a line on stdin after printing
`uploaded PATH CONTENT` (the test reads the file back through the API),
`ok restarted` (the test waits until the sandbox runs commands again) and
`checkpoint-taken ID` (the test changes a file and starts a command). At
the end it prints every request the browser made (`request PHASE URL`, from Chromium's performance log, or in Firefox from
the page's resource timing; PHASE is `port` while the port link was
followed, else `console`), every console message (`console LEVEL TEXT`,
Chromium only), then `done`. Screenshots go to SHOTS (`firefox-NAME.png`
from Firefox).
"""

import json
import os
import re
import sys
import tempfile
import time

from selenium import webdriver
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.firefox.options import Options as FirefoxOptions
from selenium.webdriver.firefox.service import Service as FirefoxService
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

TIMEOUT = 60


def say(line):
    print(line, flush=True)


def chromium():
    opts = Options()
    opts.binary_location = "/usr/bin/chromium"
    for arg in (
        "--headless=new",
        "--no-sandbox",  # the test runs as root
        "--disable-dev-shm-usage",
        "--window-size=1280,800",
        "--no-proxy-server",
        "--no-first-run",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    # An explicit driver path: Selenium Manager downloads nothing.
    d = webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=opts)
    viewport(d, 1280, 800)
    return d


def firefox(geckodriver):
    """Debian's Firefox ESR through geckodriver (built from crates.io)."""
    opts = FirefoxOptions()
    opts.binary_location = "/usr/bin/firefox-esr"
    opts.add_argument("-headless")
    # Nothing of Firefox's own reaches out (updates, telemetry, captive
    # portal checks), and whatever would goes to a proxy on a closed
    # loopback port: the test allows only loopback traffic, which is never
    # proxied.
    for pref, value in (
        ("network.proxy.type", 1),
        ("network.proxy.http", "127.0.0.1"),
        ("network.proxy.http_port", 9),
        ("network.proxy.ssl", "127.0.0.1"),
        ("network.proxy.ssl_port", 9),
        ("network.proxy.allow_hijacking_localhost", False),
        ("network.trr.mode", 5),
        ("app.update.enabled", False),
        ("network.captive-portal-service.enabled", False),
        ("network.connectivity-service.enabled", False),
        ("datareporting.policy.dataSubmissionEnabled", False),
        ("toolkit.telemetry.enabled", False),
        ("browser.safebrowsing.update.enabled", False),
        ("extensions.update.enabled", False),
        ("browser.shell.checkDefaultBrowser", False),
    ):
        opts.set_preference(pref, value)
    d = webdriver.Firefox(service=FirefoxService(executable_path=geckodriver), options=opts)
    viewport(d, 1280, 800)
    return d


def viewport(d, width, height):
    """Sizes the window so that the page itself gets width x height."""
    d.set_window_size(width, height)
    inner_w, inner_h = d.execute_script("return [innerWidth, innerHeight]")
    d.set_window_size(2 * width - inner_w, 2 * height - inner_h)


class Console:
    def __init__(self, driver, base, shots, prefix=""):
        self.d = driver
        self.base = base
        self.shots = shots
        self.prefix = prefix

    def wait(self, what, cond, timeout=TIMEOUT):
        def attempt(_):
            try:
                return cond()
            except (NoSuchElementException, StaleElementReferenceException):
                return False

        try:
            return WebDriverWait(self.d, timeout, poll_frequency=0.2).until(attempt)
        except Exception:
            self.shot("failed")
            raise AssertionError(f"timed out waiting for {what}; page text:\n{self.text('body')}")

    def find(self, css):
        return self.d.find_element(By.CSS_SELECTOR, css)

    def text(self, css):
        try:
            return self.find(css).text
        except NoSuchElementException:
            return ""

    def click(self, css):
        """Clicks once the element is there (lists re-render as they poll)."""
        def go():
            self.find(css).click()
            return True

        self.wait(f"{css} to click", go)

    def shot(self, name):
        self.d.save_screenshot(os.path.join(self.shots, f"{self.prefix}{name}.png"))

    def sign_in(self, token):
        self.wait("the token field", lambda: self.find("#token").is_displayed())
        field = self.find("#token")
        field.clear()
        field.send_keys(token, Keys.ENTER)

    def drain(self, phase):
        for entry in self.d.get_log("performance"):
            msg = json.loads(entry["message"])["message"]
            if msg["method"] == "Network.requestWillBeSent":
                url = msg["params"]["request"]["url"]
            elif msg["method"] == "Network.webSocketCreated":
                url = msg["params"]["url"]
            else:
                continue
            if url.startswith("blob:"):
                url = url[len("blob:"):]
            say(f"request {phase} {url}")

    def resources(self, phase):
        """Every request of the page from its resource timing (Firefox
        has no network log; WebSockets are not in it)."""
        for url in self.d.execute_script("return performance.getEntriesByType('resource').map(e => e.name)"):
            say(f"request {phase} {url}")

    def console_messages(self):
        for entry in self.d.get_log("browser"):
            say(f"console {entry['level']} {entry['message']}")


def sign_in_steps(c):
    """Refused with a wrong token, then in with the right one."""
    c.d.get(c.base + "/ui/")
    c.shot("signin")
    c.sign_in("not-the-token")
    c.wait("the refused page", lambda: "Token refused" in c.text("#refused"))
    c.shot("refused")
    say("ok refused")
    c.click("#try-again")
    c.sign_in(os.environ["SANDBOXD_TOKEN"])
    c.wait("the sandboxes list", lambda: c.find("#sandboxes").is_displayed())
    say("ok signed-in")


def listed_steps(c, row):
    c.wait("the test's sandbox in the list", lambda: c.find(row).is_displayed())
    filt = c.find("#filter")
    filt.send_keys("no-such-session")
    c.wait("the filter to hide it", lambda: not c.d.find_elements(By.CSS_SELECTOR, row))
    filt.clear()
    filt.send_keys("ui:con")
    c.wait("the filter to show it", lambda: c.find(row).is_displayed())
    c.shot("sandboxes")
    viewport(c.d, 390, 844)
    sizes = c.d.execute_script(
        "return [document.documentElement.scrollWidth, window.innerWidth]"
    )
    assert sizes[0] <= sizes[1], f"the list scrolls sideways at phone width: {sizes}"
    c.shot("sandboxes-phone-width")
    viewport(c.d, 1280, 800)
    say("ok listed")


def commands_steps(c, row, ticker):
    """A finished command's retained output, then the running one live."""
    c.click(f"{row} a")
    c.wait("the finished command", lambda: "finished-output" in c.text("#commands"))
    for tr in c.d.find_elements(By.CSS_SELECTOR, "#commands tr[data-command]"):
        if "finished-output" in tr.text:
            tr.find_element(By.CSS_SELECTOR, "button").click()
            break
    c.wait("the finished command's output", lambda: "[exit 0" in c.text("#log") and "finished-output" in c.text("#log"))
    c.click(f'tr[data-command="{ticker}"] button')
    ticks = lambda: [int(n) for n in re.findall(r"tick-(\d+)", c.text("#log"))]
    c.wait("tick lines", lambda: ticks())
    first = max(ticks())
    c.wait("a later tick arriving live", lambda: max(ticks()) > first)
    c.d.execute_script("document.getElementById('log-head').scrollIntoView({block: 'center'})")
    c.shot("commands")
    say(f"ok live-log tick-{first} then tick-{max(ticks())}")


def terminal_steps(c):
    """Types a command, sees it echoed and answered; detaches and attaches
    again, and the scrollback still has it."""
    c.click("#to-terminal")
    c.click("#new-terminal")
    c.wait("the terminal to attach", lambda: "typing goes in" in c.text("#term-state"))
    # Keys go to what has focus: xterm's hidden textarea, once attached.
    ActionChains(c.d).send_keys("echo hello-from-ui", Keys.ENTER).perform()
    screen = lambda: c.text("#terminal .xterm-rows")
    c.wait("the echo and its output", lambda: screen().count("hello-from-ui") >= 2)
    c.shot("terminal")
    c.click("#detach")
    c.wait("detached", lambda: "Detached" in c.text("#term-state"))
    c.click("#ptys button.attach")
    c.wait("the scrollback after attaching again", lambda: screen().count("hello-from-ui") >= 2)
    say("ok terminal")


def file_view_steps(c):
    c.click("#to-files")
    c.click('li[data-file="notes"] button')
    c.click('li[data-file="readme.txt"] button')
    c.wait("the file's text", lambda: "written through the API" in c.text("#file-text"))
    href = c.find("#download").get_attribute("href")
    assert href.startswith("blob:"), href
    c.shot("files")
    say("ok file-viewed")


def full(c, sid, ticker, port_url):
    row = f'tr[data-sandbox="{sid}"]'
    listed_steps(c, row)
    commands_steps(c, row, ticker)
    terminal_steps(c)
    file_view_steps(c)
    content = f"uploaded-through-the-console-{os.getpid()}"
    folder = tempfile.mkdtemp()
    local = os.path.join(folder, "from-the-browser.txt")
    with open(local, "w") as f:
        f.write(content + "\n")
    c.find("#upload").send_keys(local)
    c.wait("the upload", lambda: "Uploaded" in c.text("#files-status"))
    c.wait("the upload listed", lambda: c.find('li[data-file="from-the-browser.txt"]').is_displayed())
    say(f"uploaded /workspace/notes/from-the-browser.txt {content}")
    sys.stdin.readline()

    # Ports: the link is the port's URL, and following it shows its page.
    c.click("#to-ports")
    c.wait("the port link", lambda: c.find('li[data-port="8000"] a').get_attribute("href").startswith(port_url))
    c.shot("ports")
    c.drain("console")
    console_window = c.d.current_window_handle
    c.click('li[data-port="8000"] a')
    c.wait("a new tab", lambda: len(c.d.window_handles) == 2)
    c.d.switch_to.window([h for h in c.d.window_handles if h != console_window][0])
    c.wait("the port's page", lambda: "served-to-the-console" in c.text("body"))
    say(f"ok port-page {c.text('body')}")
    c.d.close()
    c.d.switch_to.window(console_window)
    c.drain("port")

    c.click('a[href="#/status"]')
    c.wait("the status table", lambda: "Pool target" in c.text("#status"))
    c.shot("status")
    say("ok status")

    # Restart after confirming (the test sees its running command end).
    c.click('a[href="#/sandboxes"]')
    c.click(f"{row} button.restart")
    c.wait("the confirmation", lambda: c.find("#confirm").is_displayed())
    c.click("#confirm-ok")
    c.wait("the dialog closed", lambda: not c.find("#confirm").is_displayed())
    say("ok restarted")
    sys.stdin.readline()  # the test waits for the restart to be over

    checkpoint_steps(c, sid)

    # Stop: cancel first (it stays), then confirm (it goes).
    c.click(f"{row} button.stop")
    c.wait("the confirmation", lambda: c.find("#confirm").is_displayed())
    c.shot("confirm-stop")
    c.click("#confirm-cancel")
    time.sleep(2.5)  # two polls of the list: nothing may have stopped it
    assert c.find(row).is_displayed(), "cancel kept the sandbox"
    c.click(f"{row} button.stop")
    c.wait("the confirmation", lambda: c.find("#confirm").is_displayed())
    c.click("#confirm-ok")
    c.wait("the sandbox gone from the list", lambda: not c.d.find_elements(By.CSS_SELECTOR, row))
    c.shot("stopped")
    say("ok stopped")


def checkpoint_row(c, label):
    """The checkpoint row whose label is `label`, or None."""
    for tr in c.d.find_elements(By.CSS_SELECTOR, "#checkpoints tr[data-checkpoint]"):
        if tr.find_element(By.CSS_SELECTOR, "td").text.split("\n")[0] == label:
            return tr
    return None


def take_checkpoint(c, label):
    """Takes a checkpoint labelled `label` through the form; its id."""
    c.find("#checkpoint-label").send_keys(label)
    c.click("#take-checkpoint")
    c.wait(f"the checkpoint {label} listed", lambda: checkpoint_row(c, label) is not None)
    return checkpoint_row(c, label).get_attribute("data-checkpoint")


def confirm(c, title):
    """Accepts the confirmation once it asks `title`."""
    c.wait(f"the confirmation {title!r}", lambda: c.find("#confirm").is_displayed() and c.text("#confirm-title") == title)
    c.click("#confirm-ok")


def checkpoint_steps(c, sid):
    """Takes a checkpoint, deletes another; after the test changed a file
    (and started a command), diffs against now and restores, confirming
    twice (the second to end the running command)."""
    c.click(f'tr[data-sandbox="{sid}"] a')
    c.click("#to-checkpoints")
    # The view renders after the click: its form is there once shown.
    c.wait("the checkpoint form", lambda: c.find("#checkpoint-label").is_displayed())
    kept = take_checkpoint(c, "before-edit")
    # Refused (the label is taken): the API's own sentence is shown.
    c.find("#checkpoint-label").send_keys("before-edit")
    c.click("#take-checkpoint")
    c.wait("the refusal", lambda: c.find("#checkpoints-status").get_attribute("class") == "error")
    say(f"checkpoint-refused {c.text('#checkpoints-status')}")
    c.find("#checkpoint-label").clear()
    take_checkpoint(c, "scratch")
    c.click(f'tr[data-checkpoint="{checkpoint_row(c, "scratch").get_attribute("data-checkpoint")}"] button.delete')
    confirm(c, "Delete this checkpoint?")
    c.wait("the deleted checkpoint gone", lambda: checkpoint_row(c, "scratch") is None)
    assert checkpoint_row(c, "before-edit") is not None, "the other checkpoint stays"
    say(f"checkpoint-taken {kept}")
    sys.stdin.readline()

    c.click(f'tr[data-checkpoint="{kept}"] button.diff')
    c.wait("the modified file in the diff", lambda: c.find('#diff-modified li[data-path="notes/readme.txt"]').is_displayed())
    c.shot("checkpoints")
    say(f"ok diff {' '.join(li.get_attribute('data-path') for li in c.d.find_elements(By.CSS_SELECTOR, '#diff li[data-path]'))}")

    c.click(f'tr[data-checkpoint="{kept}"] button.restore')
    confirm(c, "Restore this checkpoint?")
    c.wait("the second confirmation", lambda: c.find("#confirm").is_displayed() and c.text("#confirm-title") == "Commands are running")
    c.shot("confirm-end-commands")
    confirm(c, "Commands are running")
    c.wait("the restore", lambda: "Restored before-edit" in c.text("#checkpoints-status"))
    c.shot("checkpoint-restored")
    say("ok checkpoint-restored")
    c.click('a[href="#/sandboxes"]')


# What a keyboard can reach on the page (enabled, shown, not in a closed
# dialog), each described by what it is and the row it is in, which stays
# the same when a polled table renders it again.
DESCRIBE = """
window.describeForKeyboard = (e) => {
  const row = e.closest('[data-key]');
  const text = (e.textContent || e.getAttribute('aria-label') || '').trim().slice(0, 40);
  return `${e.tagName.toLowerCase()}#${e.id}.${e.className} "${text}"${row ? ' in ' + row.dataset.key : ''}`;
};
"""
REACHABLE = DESCRIBE + """
return [...document.querySelectorAll('a[href], button, input, select, textarea, [tabindex]')]
  .filter(e => e.tabIndex >= 0 && !e.disabled && !e.closest('dialog:not([open])')
    && e.getClientRects().length > 0 && getComputedStyle(e).visibility !== 'hidden')
  .map(e => window.describeForKeyboard(e));
"""
# The focused element and whether its focus shows: :focus-visible with an
# outline of at least 2px.
FOCUSED = DESCRIBE + """
const e = document.activeElement;
if (!e || e === document.body || e === document.documentElement) return null;
const s = getComputedStyle(e);
return [window.describeForKeyboard(e),
        e.matches(':focus-visible') && s.outlineStyle !== 'none' && parseFloat(s.outlineWidth) >= 2];
"""


class Keyboard:
    """Keys sent to whatever has focus, as a person at a keyboard does."""

    def __init__(self, c):
        self.c = c

    def press(self, *keys):
        ActionChains(self.c.d).send_keys(*keys).perform()

    def shift_tab(self):
        ActionChains(self.c.d).key_down(Keys.SHIFT).send_keys(Keys.TAB).key_up(Keys.SHIFT).perform()

    def focused(self):
        return self.c.d.execute_script(FOCUSED)

    def active_matches(self, css):
        return self.c.d.execute_script("return !!document.activeElement && document.activeElement.matches(arguments[0])", css)

    def tab_to(self, css, most=80):
        """Tabs until the focused element matches `css`."""
        for _ in range(most):
            if self.active_matches(css):
                return
            self.press(Keys.TAB)
        raise AssertionError(f"{css} not reached in {most} presses of Tab; page text:\n{self.c.text('body')}")

    def every_control_reached(self, page):
        """Tabs round the whole page: every control gets focus, and shows it."""
        want = set(self.c.d.execute_script(REACHABLE))
        assert want, f"{page}: nothing to reach"
        # From the top: the skip link is first, reached back from the next.
        self.c.d.execute_script("document.querySelector('.skip').focus()")
        self.press(Keys.TAB)
        self.shift_tab()
        seen, unseen_focus = set(), []
        for _ in range(2 * len(want) + 10):
            now = self.focused()
            if now:
                seen.add(now[0])
                if not now[1]:
                    unseen_focus.append(now[0])
            if want <= seen:
                break
            self.press(Keys.TAB)
        missing = want - seen
        assert not missing, f"{page}: not reached by Tab: {sorted(missing)}"
        assert not unseen_focus, f"{page}: focused without a visible focus style: {sorted(set(unseen_focus))}"
        say(f"ok reachable {page} {len(want)}")


def keyboard(c, sid):
    """Only keys, never a click: sign in, every control of each page in
    reach of Tab with its focus shown, open the sandbox from the list,
    reach Stop, a dialog that keeps focus and closes on Escape, then stop
    it after confirming and see it gone."""
    k = Keyboard(c)
    c.d.get(c.base + "/ui/")
    c.wait("the token field", lambda: c.find("#token").is_displayed())
    k.every_control_reached("signin")
    k.tab_to("#token")
    k.press(os.environ["SANDBOXD_TOKEN"], Keys.ENTER)
    row = f'tr[data-sandbox="{sid}"]'
    c.wait("the sandbox in the list", lambda: c.find(row).is_displayed())
    say("ok signed-in")
    k.every_control_reached("sandboxes")
    for tab, ready in (
        ("commands", "#commands tr[data-command] button"),
        ("files", 'li[data-file="notes"] button'),
        ("terminal", "#new-terminal"),
        ("ports", "#ports li"),
        ("checkpoints", "#checkpoints tr[data-checkpoint] button.restore"),
    ):
        c.d.get(f"{c.base}/ui/#/sandboxes/{sid}/{tab}")
        c.wait(f"the {tab} tab", lambda: c.find(ready).is_displayed() and c.find(".sandbox-head button.stop").is_displayed())
        k.every_control_reached(tab)
    # In a terminal, Tab is the shell's (completion); Shift+Tab leaves it.
    c.d.get(f"{c.base}/ui/#/sandboxes/{sid}/terminal")
    c.wait("the terminal tab", lambda: c.find("#new-terminal").is_displayed())
    k.tab_to("#new-terminal")
    k.press(Keys.ENTER)
    c.wait("the terminal to attach", lambda: "typing goes in" in c.text("#term-state"))
    c.wait("focus in the terminal", lambda: k.active_matches("#terminal textarea"))
    k.press("echo tab", Keys.TAB, "-completed", Keys.ENTER)
    c.wait("the Tab typed into the shell", lambda: "tab-completed" in c.text("#terminal .xterm-rows"))
    assert k.active_matches("#terminal textarea"), f"Tab stayed in the terminal: {k.focused()}"
    k.shift_tab()
    assert k.active_matches("#detach"), f"Shift+Tab left the terminal: {k.focused()}"
    say("ok terminal-left")
    c.d.get(c.base + "/ui/#/status")
    c.wait("the status table", lambda: "Pool target" in c.text("#status"))
    k.every_control_reached("status")

    c.d.get(c.base + "/ui/#/sandboxes")
    c.wait("the sandbox in the list", lambda: c.find(row).is_displayed())
    k.tab_to(f"{row} a")
    k.press(Keys.ENTER)
    c.wait("the sandbox page", lambda: c.find(".sandbox-head button.stop").is_displayed())
    k.tab_to(".sandbox-head button.stop")
    k.press(Keys.ENTER)
    dialog_open = lambda: c.d.execute_script("return document.getElementById('confirm').open")
    c.wait("the confirmation", dialog_open)
    assert k.active_matches("#confirm-cancel"), k.focused()
    k.press(Keys.TAB)
    assert k.active_matches("#confirm-ok"), k.focused()
    k.press(Keys.TAB)
    assert k.active_matches("#confirm-cancel"), f"Tab stays in the dialog: {k.focused()}"
    k.shift_tab()
    assert k.active_matches("#confirm-ok"), f"Shift+Tab stays in the dialog: {k.focused()}"
    c.shot("keyboard-confirm")
    k.press(Keys.ESCAPE)
    c.wait("Escape to close the dialog", lambda: not dialog_open())
    assert k.active_matches(".sandbox-head button.stop"), f"focus back on Stop: {k.focused()}"
    say("ok escaped")
    sys.stdin.readline()  # the test checks the sandbox is still there
    k.press(Keys.SPACE)
    c.wait("the confirmation again", dialog_open)
    k.press(Keys.TAB)
    k.press(Keys.SPACE)
    c.wait("the sandbox gone from the list", lambda: c.find("#sandboxes").is_displayed() and not c.d.find_elements(By.CSS_SELECTOR, row))
    say("ok stopped")


def in_firefox(c, sid, ticker):
    """The main scenario's core in Firefox: sign-in, the list, the live
    log, the terminal and a file."""
    row = f'tr[data-sandbox="{sid}"]'
    sign_in_steps(c)
    listed_steps(c, row)
    commands_steps(c, row, ticker)
    terminal_steps(c)
    file_view_steps(c)
    say(f"ok browser {c.d.capabilities['browserName']} {c.d.capabilities['browserVersion']}")
    c.resources("console")


def main():
    scenario, base, shots = sys.argv[1:4]
    if scenario == "firefox":
        d = firefox(sys.argv[4])
    else:
        d = chromium()
    try:
        c = Console(d, base, shots, "firefox-" if scenario == "firefox" else "")
        if scenario == "firefox":
            in_firefox(c, *sys.argv[5:7])
        elif scenario == "keyboard":
            keyboard(c, sys.argv[4])
        elif scenario == "full":
            sign_in_steps(c)
            full(c, *sys.argv[4:7])
        else:
            sign_in_steps(c)
            c.wait("the empty list", lambda: "0 of 0 sandboxes" in c.text("main"))
            c.shot("smoke-sandboxes")
        if scenario != "firefox":
            c.drain("console")
            c.console_messages()
        say("done")
    finally:
        d.quit()


if __name__ == "__main__":
    main()
