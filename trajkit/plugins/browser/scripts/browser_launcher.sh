#!/bin/sh
# The browser Playwright launches for one session whose browser runs inside its sandbox. Playwright
# writes DevTools commands to file descriptor 3 and reads replies from 4; the sandbox backend's
# bridge runs the browser in the sandbox with that pipe as its standard input and output, and
# nothing else.
@ENV@
exec @BRIDGE@ "$@" <&3 >&4 3<&- 4>&-
