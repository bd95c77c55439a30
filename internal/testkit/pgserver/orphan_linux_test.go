package pgserver

// orphanModes are the ways a server dies with its process on this OS, each
// prepared by its func in the process that starts the server: the kernel's
// Pdeathsig, and the watchdog that macOS and the BSDs use.
var orphanModes = map[string]func(){
	"Pdeathsig": func() {},
	"Watchdog":  func() { usePdeathsig = false },
}
