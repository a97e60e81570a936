"""What tasks and engines share: typed requests and the metrics they are scored with. Tasks
(documents -> requests -> scores) and engines (requests -> model responses) both import this and
never each other."""
