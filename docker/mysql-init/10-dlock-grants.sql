-- Run once by the mysql image's entrypoint, after it created database `dlock`
-- and user 'dlock'@'%' from MYSQL_DATABASE / MYSQL_USER / MYSQL_PASSWORD.
-- The lock tests look at and kill other sessions.
GRANT ALL PRIVILEGES ON dlock.* TO 'dlock'@'%';
GRANT PROCESS, CONNECTION_ADMIN ON *.* TO 'dlock'@'%';
FLUSH PRIVILEGES;
